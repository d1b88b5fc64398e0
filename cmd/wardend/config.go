package main

import "runtime/debug"

// version is the release's version, set by a release build
// (-ldflags "-X main.version=v1.2.3"); "dev" otherwise.
var version = "dev"

// buildVersion is version with the VCS revision the binary was built
// from, when the build recorded one ("dev+1a2b3c4d5e6f", "-dirty" for
// uncommitted changes).
func buildVersion() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		v += "+" + rev[:min(12, len(rev))]
		if dirty {
			v += "-dirty"
		}
	}
	return v
}
