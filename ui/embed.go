// Package ui serves Warden's web dashboard: the static, prebuilt page in
// dist/ (built from src/ by `npm run build`, see README.md), embedded in
// the binary. The page is a client of the node's own Connect API: it
// lists nodes, shards, hot locks, operations, one lock and a quota tree,
// refreshing at most once a second, and calls the write RPCs
// (TransferLeader, MoveReplica, RevokeLease) only after an explicit
// confirmation. It holds no state on the server and needs no other
// route.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed all:dist
var dist embed.FS

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

// ContentSecurityPolicy confines the page to its own scripts and styles,
// with no inline code, plugins, frames or form posts. connect-src also
// allows any http: and https: origin, because the page may be pointed at
// another node's API (?endpoint=, the Settings field): which origins may
// call that node is its own CORS list (wardend --cors-allowed-origins) to
// decide, not this page's.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self' http: https:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// contentTypes are the types of the files dist/ holds; any other file is
// served as application/octet-stream.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
	".json": "application/json",
	".txt":  "text/plain; charset=utf-8",
}

type file struct {
	data  []byte
	etag  string
	ctype string
}

// Handler serves the dashboard under Prefix (/ui/): GET and HEAD only
// (405 otherwise), /ui redirected to /ui/ with its query kept (the page
// reads ?endpoint= and ?protocol=), index.html at /ui/, 404 for a path
// that names no file. Every answer carries the security headers
// (Content-Security-Policy, X-Content-Type-Options: nosniff,
// X-Frame-Options: DENY, Referrer-Policy: no-referrer). The files' names
// carry no content hash, so each is served with Cache-Control: no-cache
// and a strong ETag (its SHA-256): browsers revalidate, and a node
// upgraded to a new build is never mixed with an old one's assets.
//
// Mount it on both "/ui/" and "/ui" (or on "/ui/" alone: http.ServeMux
// then redirects /ui itself). It needs no authentication: the page holds
// no secret, and its API calls carry the user's own bearer token.
func Handler() http.Handler {
	files := map[string]*file{}
	err := fs.WalkDir(dist, "dist", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := dist.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		ctype, ok := contentTypes[path.Ext(p)]
		if !ok {
			ctype = "application/octet-stream"
		}
		files[strings.TrimPrefix(p, "dist/")] = &file{data: data, etag: `"` + hex.EncodeToString(sum[:16]) + `"`, ctype: ctype}
		return nil
	})
	if err != nil {
		panic("ui: reading the embedded dist/: " + err.Error()) // the embed is fixed at build time
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
			target := Prefix
			if r.URL.RawQuery != "" {
				target += "?" + r.URL.RawQuery
			}
			http.Redirect(w, r, target, http.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		if name == "" {
			name = "index.html"
		}
		f := files[name]
		if f == nil {
			http.NotFound(w, r)
			return
		}
		h.Set("Content-Type", f.ctype)
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		// ServeContent answers If-None-Match with 304, and Range and HEAD.
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.data))
	})
}
