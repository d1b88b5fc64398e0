# shellcheck shell=bash
# lib.sh holds what etcd.sh and zk.sh share: the layout of the data
# directory, pid-file handling, stopping a member, finding the leader, the
# port, install and start checks, and the command dispatch. Each script sets
# PEER_NAME (its name: etcd, zk) and sources this file with
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# and then defines the functions this file calls:
#
#   member_marker N  prints a string that only member N's command line has
#                    (member_pid checks /proc/PID/cmdline for it).
#   endpoint N       prints member N's client address, as endpoints lists it.
#   is_leader N      succeeds when member N is the leader.
#   start_member N   starts member N in the background and writes its pid
#                    file.
#   start, stop, status, install
#                    the commands of the same name.
#
# It also reads LEADER_WAIT, the seconds find_leader waits for a leader.
# Member n (1..3) keeps its data, log and pid file in $DIR/$PEER_NAME<n>/.

: "${PEER_NAME:?PEER_NAME must be set before sourcing lib.sh}"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DIR=${LOADTEST_PEER_DIR:-$ROOT/data/peers/$PEER_NAME}
START_TIMEOUT=${PEER_START_TIMEOUT:-60}
HOST=127.0.0.1
MEMBERS=(1 2 3)

die() { echo "$PEER_NAME.sh: $*" >&2; exit 1; }

member_dir() { echo "$DIR/$PEER_NAME$1"; }
pid_file() { echo "$(member_dir "$1")/$PEER_NAME.pid"; }
log_file() { echo "$(member_dir "$1")/$PEER_NAME.log"; }

# check_ports HINT PORT_FN... dies when two of the members' ports are the
# same (PORT_FN N prints one port of member N); HINT names the variables
# that choose them.
check_ports() {
	local hint=$1 seen=" " p n f
	shift
	for n in "${MEMBERS[@]}"; do
		for f in "$@"; do
			p=$("$f" "$n")
			[[ $seen == *" $p "* ]] && die "port $p is used twice: choose $hint so that base+0/10/20 do not overlap"
			seen+="$p "
		done
	done
}

# member_pid N prints the pid of member N when it is running (a live process
# whose command line contains member_marker N), else nothing.
member_pid() {
	local f pid
	f=$(pid_file "$1")
	[[ -f $f ]] || return 0
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] || return 0
	if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(member_marker "$1")"; then
		echo "$pid"
	fi
}

# apt_install PKG installs the Debian package PKG without questions (running
# apt-get update when the first try fails), apt-get's output on stderr.
apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y "$1" >&2; then
		apt-get update >&2
		apt-get install -y "$1" >&2
	fi
}

# stop_system_service NAME stops and disables the system service NAME
# (systemd or sysvinit), if there is one.
stop_system_service() {
	if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
		systemctl disable --now "$1" >/dev/null 2>&1 || true
	fi
	if [[ -x /etc/init.d/$1 ]]; then
		"/etc/init.d/$1" stop >/dev/null 2>&1 || true
		command -v update-rc.d >/dev/null 2>&1 && update-rc.d "$1" disable >/dev/null 2>&1 || true
	fi
}

log_tails() {
	local n
	for n in "${MEMBERS[@]}"; do
		echo "---- $PEER_NAME$n log tail ($(log_file "$n")) ----" >&2
		tail -n 20 "$(log_file "$n")" >&2 2>/dev/null || true
	done
}

# start_missing SETTLE starts every member that is not running, waits SETTLE
# seconds, and exits 1 with the log tails when one of them is not running
# then. It sets STARTED to 1 when it started any member, else 0.
start_missing() {
	local n
	STARTED=0
	mkdir -p "$DIR"
	for n in "${MEMBERS[@]}"; do
		if [[ -z $(member_pid "$n") ]]; then
			start_member "$n"
			STARTED=1
		fi
	done
	# A member that dies at once (port in use, bad flag) shows up here.
	sleep "$1"
	for n in "${MEMBERS[@]}"; do
		if [[ -z $(member_pid "$n") ]]; then
			echo "$PEER_NAME.sh: $PEER_NAME$n exited right after start" >&2
			log_tails
			exit 1
		fi
	done
}

# stop_member N [SIG] sends SIG (default TERM) to member N when it is
# running, sends SIGKILL when it is still there after 10 s, waits up to 5 s
# more for it to go, and removes its pid file.
stop_member() {
	local n=$1 sig=${2:-TERM} pid i
	pid=$(member_pid "$n")
	if [[ -n $pid ]]; then
		kill "-$sig" "$pid" 2>/dev/null || true
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			kill -KILL "$pid" 2>/dev/null || true
			for ((i = 0; i < 50; i++)); do
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.1
			done
		fi
	fi
	rm -f "$(pid_file "$n")"
}

# leader prints the number of the running member that is the leader; it
# fails when there is none.
leader() {
	local n
	for n in "${MEMBERS[@]}"; do
		[[ -n $(member_pid "$n") ]] || continue
		if is_leader "$n"; then
			echo "$n"
			return 0
		fi
	done
	return 1
}

# find_leader waits up to LEADER_WAIT seconds for a leader (one may be
# mid-election).
find_leader() {
	local deadline=$((SECONDS + LEADER_WAIT)) l
	while ((SECONDS < deadline)); do
		if l=$(leader); then
			echo "$l"
			return 0
		fi
		sleep 0.2
	done
	die "no leader found"
}

endpoints() {
	local n out=""
	for n in "${MEMBERS[@]}"; do
		out+="${out:+,}$(endpoint "$n")"
	done
	echo "$out"
}

# dispatch runs the command the script's arguments name (see its usage).
dispatch() {
	local l n
	case "${1:-}" in
	start) start ;;
	stop) stop ;;
	status) status ;;
	kill)
		[[ ${2:-} =~ ^[1-3]$ ]] || die "usage: $PEER_NAME.sh kill N (N in 1..3)"
		[[ -n $(member_pid "$2") ]] || die "$PEER_NAME$2 is not running"
		stop_member "$2" KILL
		echo "$2"
		;;
	killleader)
		l=$(find_leader)
		stop_member "$l" KILL
		echo "$l"
		;;
	killfollower)
		l=$(find_leader)
		for n in "${MEMBERS[@]}"; do
			if [[ $n != "$l" && -n $(member_pid "$n") ]]; then
				stop_member "$n" KILL
				echo "$n"
				exit 0
			fi
		done
		die "no running follower"
		;;
	leader) leader || die "no leader" ;;
	endpoints) endpoints ;;
	pids)
		for n in "${MEMBERS[@]}"; do
			member_pid "$n"
		done
		;;
	install) install ;;
	clean)
		stop
		rm -rf "$DIR"
		;;
	*)
		echo "usage: $0 start|stop|status|kill N|killleader|killfollower|leader|endpoints|install|clean" >&2
		exit 2
		;;
	esac
}
