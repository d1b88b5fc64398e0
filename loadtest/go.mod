module github.com/warden-dev/warden/loadtest

go 1.26.0

require (
	connectrpc.com/connect v1.19.1
	github.com/HdrHistogram/hdrhistogram-go v1.4.0
	github.com/alecthomas/kong v1.12.1
	github.com/go-zookeeper/zk v1.0.4
	github.com/prometheus/client_model v0.6.1
	github.com/prometheus/common v0.62.0
	github.com/prometheus/procfs v0.15.1
	github.com/warden-dev/warden v0.0.0-00010101000000-000000000000
	github.com/warden-dev/warden/client v0.0.0-00010101000000-000000000000
	github.com/warden-dev/warden/proto v0.0.0-00010101000000-000000000000
	go.etcd.io/etcd/api/v3 v3.5.35
	go.etcd.io/etcd/client/v3 v3.5.35
	go.uber.org/zap v1.17.0
	gonum.org/v1/plot v0.15.2
	google.golang.org/grpc v1.83.2
	google.golang.org/protobuf v1.36.12
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.1.0 // indirect
	codeberg.org/go-pdf/fpdf v0.10.0 // indirect
	git.sr.ht/~sbinet/gg v0.6.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/campoy/embedmd v1.0.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coreos/go-semver v0.3.0 // indirect
	github.com/coreos/go-systemd/v22 v22.3.2 // indirect
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/prometheus/client_golang v1.22.0 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.5.35 // indirect
	go.uber.org/atomic v1.7.0 // indirect
	go.uber.org/multierr v1.6.0 // indirect
	golang.org/x/image v0.25.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d // indirect
)

replace (
	github.com/warden-dev/warden => ../
	github.com/warden-dev/warden/client => ../client
	github.com/warden-dev/warden/proto => ../proto
)
