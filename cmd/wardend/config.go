package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/alecthomas/kong"
	"go.yaml.in/yaml/v3"
)

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

// noFileSource lists the flags that only the command line may set: the
// safety overrides (--insecure and the debug flags: docs/security.md),
// and the config file itself.
var noFileSource = []string{"insecure", "debug-clock-offset", "config", "version", "help"}

// yamlConfig is the config-file loader (wardend --config): a YAML
// mapping from flag names, as on the command line without the dashes,
// to their values (lists for repeatable flags), for example
//
//	node-id: 1
//	zone: az1
//	raft-addr: 10.0.1.5:7100
//	listen: 0.0.0.0:7070
//	advertise-addr: node1.example:7070
//	join: [node2.example:7070, node3.example:7070]
//
// A key that is not a flag, or names one without a file source, is
// refused naming it.
func yamlConfig(r io.Reader) (kong.Resolver, error) {
	var values map[string]any
	if err := yaml.NewDecoder(r).Decode(&values); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return fileResolver(values), nil
}

type fileResolver map[string]any

// Validate refuses keys that are no flag, or a flag without a file
// source.
func (f fileResolver) Validate(app *kong.Application) error {
	flags := map[string]bool{}
	for _, fl := range app.Flags {
		flags[fl.Name] = true
	}
	for key := range f {
		switch {
		case slices.Contains(noFileSource, key):
			return fmt.Errorf("--config: %q can only be given on the command line", key)
		case !flags[key]:
			return fmt.Errorf("--config: %q is not a wardend flag (keys are flag names without the dashes)", key)
		}
	}
	return nil
}

// Resolve returns the file's value of flag, if any, unless the flag's
// environment variable is set: kong applies resolvers before the
// environment, and the environment is to win over the file (as the
// command line wins over both).
func (f fileResolver) Resolve(_ *kong.Context, _ *kong.Path, flag *kong.Flag) (any, error) {
	if slices.Contains(noFileSource, flag.Name) {
		return nil, nil
	}
	for _, e := range flag.Envs {
		if _, set := os.LookupEnv(e); set {
			return nil, nil
		}
	}
	v, ok := f[flag.Name]
	if !ok {
		return nil, nil
	}
	if list, ok := v.([]any); ok {
		// kong takes a repeatable flag's values joined by its separator.
		parts := make([]string, len(list))
		for i, x := range list {
			parts[i] = fmt.Sprint(x)
		}
		return strings.Join(parts, ","), nil
	}
	return v, nil
}
