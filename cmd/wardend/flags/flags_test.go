package flags

import (
	"errors"
	"strings"
	"testing"
)

func TestResolveNodeID(t *testing.T) {
	host := func(name string) func() (string, error) { return func() (string, error) { return name, nil } }
	for _, c := range []struct {
		cli  CLI
		host string
		want uint64
		err  string
	}{
		{CLI{NodeID: 7}, "x", 7, ""},
		{CLI{NodeIDFrom: 100, PodName: "warden-az1-0"}, "ignored", 100, ""},
		{CLI{NodeIDFrom: 200}, "warden-az2-3", 203, ""},
		{CLI{NodeIDFrom: 100, NodeID: 5}, "warden-az1-0", 0, "exclude each other"},
		{CLI{NodeIDFrom: 100}, "warden", 0, `"warden" does not end in -ORDINAL`},
		{CLI{NodeIDFrom: 100}, "warden-az1-x", 0, "does not end in -ORDINAL"},
		{CLI{NodeIDFrom: 100}, "17", 0, "does not end in -ORDINAL"},
	} {
		err := c.cli.ResolveNodeID(host(c.host))
		if got := c.cli.NodeID; (c.err == "" && (err != nil || got != c.want)) || (c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err))) {
			t.Errorf("%+v on host %q: node %d, %v; want %d, %q", c.cli, c.host, got, err, c.want, c.err)
		}
	}
	c := CLI{NodeIDFrom: 1}
	if err := c.ResolveNodeID(func() (string, error) { return "", errors.New("no name") }); err == nil || !strings.Contains(err.Error(), "no name") {
		t.Errorf("a host name that cannot be read: %v", err)
	}
}
