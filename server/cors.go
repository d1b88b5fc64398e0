package server

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	connectcors "connectrpc.com/cors"
	"connectrpc.com/grpchealth"
	"github.com/rs/cors"
	"github.com/warden-dev/warden/rpc"
)

// DevCORSOrigins are the origins a dev cluster (wardend --dev) allows
// when --cors-allowed-origins is not given: pages served from loopback
// on any port, as a front end's dev server is.
var DevCORSOrigins = []string{"http://localhost:*", "http://127.0.0.1:*"}

// ParseCORSOrigins checks wardend's --cors-allowed-origins values: each
// is "*" (any origin) or an origin, scheme://host[:port], with http or
// https, no path, query or user, and a port of "*" allowed to mean any
// port. Browsers send the origin exactly so (lower-case host, no
// trailing slash), and a pattern that could never match one is refused
// rather than ignored. The error names the flag and the value.
func ParseCORSOrigins(origins []string) ([]string, error) {
	var out []string
	for _, o := range origins {
		o = strings.TrimSpace(o)
		if o == "" {
			continue
		}
		if o == "*" {
			out = append(out, o)
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("--cors-allowed-origins: %q: %s (want scheme://host[:port], a port of * for any, or * alone)", o, why)
		}
		pattern := o
		if rest, ok := strings.CutSuffix(o, ":*"); ok {
			pattern = rest + ":1" // parse with a port; * stands for any
		}
		u, err := url.Parse(pattern)
		switch {
		case err != nil:
			return nil, bad(err.Error())
		case u.Scheme != "http" && u.Scheme != "https":
			return nil, bad("the scheme must be http or https")
		case u.Host == "" || u.Hostname() == "":
			return nil, bad("no host")
		case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
			return nil, bad("an origin has no user, path, query or fragment")
		case strings.Contains(u.Hostname(), "*"):
			return nil, bad("only the port may be *")
		case strings.ToLower(u.Host) != u.Host || !strings.HasPrefix(o, u.Scheme+"://"):
			return nil, bad("browsers send the scheme and host in lower case")
		case strings.ContainsAny(o, "?#") || strings.HasSuffix(u.Host, ":"):
			return nil, bad("an origin has no query or fragment, and a port has digits")
		case strings.IndexFunc(u.Host, func(r rune) bool { return r > 0x7f }) >= 0:
			return nil, bad("browsers send an international host name in its xn-- (punycode) form")
		}
		if port := u.Port(); port != "" && !strings.HasSuffix(o, ":*") {
			n, err := strconv.Atoi(port)
			switch {
			case err != nil || n < 1 || n > 65535 || port[0] == '0':
				return nil, bad("the port must be 1 to 65535, without leading zeros")
			case u.Scheme == "http" && n == 80, u.Scheme == "https" && n == 443:
				return nil, bad("browsers leave the scheme's default port out of the origin: give " + u.Scheme + "://" + u.Hostname())
			}
		}
		out = append(out, strings.TrimSuffix(o, "/"))
	}
	return out, nil
}

// originMatches reports whether a browser's Origin header matches
// pattern (ParseCORSOrigins's forms): exactly, or with any port for a
// pattern ending in ":*" (the port's digits alone, so that
// "http://localhost:*" never matches "http://localhost.evil.example",
// or none: a page on the scheme's default port sends no port).
func originMatches(pattern, origin string) bool {
	if pattern == "*" || pattern == origin {
		return true
	}
	host, ok := strings.CutSuffix(pattern, ":*")
	if !ok {
		return false
	}
	if origin == host {
		return true
	}
	port, found := strings.CutPrefix(origin, host+":")
	return found && port != "" && strings.Trim(port, "0123456789") == ""
}

// withCORS wraps h so that browser pages from origins (ParseCORSOrigins's
// forms) may call the Connect, gRPC-Web and gRPC-Web-text protocols: it
// answers their preflights and adds the headers they need to the
// answers, naming the headers Connect and gRPC-Web read (grpc-status,
// grpc-message, the error details) as exposed. Bearer tokens pass in the
// Authorization request header, which is allowed; ambient credentials
// (cookies, client certificates) are not (no Access-Control-Allow-
// Credentials), so a page can call only with a token it holds. A request
// from any other origin gets no CORS header, and the browser hides the
// answer from the page. Without origins, h is returned as it is.
//
// Only the RPC paths (the Warden services and grpc.health.v1) take part:
// /metrics, the probes, reflection and the dashboard's files answer no
// page of another origin, whatever the list says.
func withCORS(h http.Handler, origins []string) http.Handler {
	if len(origins) == 0 {
		return h
	}
	c := cors.New(cors.Options{
		AllowOriginFunc: func(origin string) bool {
			return slices.ContainsFunc(origins, func(p string) bool { return originMatches(p, origin) })
		},
		AllowedMethods: connectcors.AllowedMethods(),
		// Beside Connect's own lists: the token, and the compression
		// headers a client may negotiate.
		AllowedHeaders: append(connectcors.AllowedHeaders(), "Authorization",
			"Connect-Accept-Encoding", "Connect-Content-Encoding", "Grpc-Accept-Encoding", "Grpc-Encoding"),
		ExposedHeaders: append(connectcors.ExposedHeaders(), "Connect-Content-Encoding", "Grpc-Encoding"),
		// Browsers cap this (Chromium at 2 h); an hour spares a page a
		// preflight before most calls.
		MaxAge: 3600,
	}).Handler(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rpc.ClientPath(r.URL.Path) || strings.HasPrefix(r.URL.Path, "/"+grpchealth.HealthV1ServiceName+"/") {
			c.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
