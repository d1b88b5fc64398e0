package placement

import "testing"

// A reserve is a size with an optional unit or a percentage; anything
// else is refused naming the value.
func TestParseDiskReserve(t *testing.T) {
	for in, want := range map[string]DiskReserve{
		"0": {}, "1GiB": {Bytes: 1 << 30}, "512MiB": {Bytes: 512 << 20}, "10GB": {Bytes: 10e9},
		"4096": {Bytes: 4096}, "5%": {Percent: 5}, "2.5 %": {Percent: 2.5}, " 64 KiB ": {Bytes: 64 << 10},
	} {
		if got, err := ParseDiskReserve(in); err != nil || got != want {
			t.Errorf("ParseDiskReserve(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1GiB", "1.5GiB", "100%", "x%", "1 gigabyte", "99999999999TiB"} {
		if _, err := ParseDiskReserve(in); err == nil {
			t.Errorf("ParseDiskReserve(%q) accepted", in)
		}
	}
	if got := (DiskReserve{Percent: 5}).of(1000); got != 50 {
		t.Errorf("5%% of 1000 bytes: %d", got)
	}
}
