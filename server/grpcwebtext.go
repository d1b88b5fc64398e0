package server

import (
	"bytes"
	"encoding/base64"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/warden-dev/warden/rpc"
)

// maxTextRequestBytes bounds a gRPC-Web-text request body, in bytes:
// one and a half times the API's bound on a request message
// (rpc.MaxRequestBytes, 96 KiB in all), room for that message and its
// frame header as base64 (4 characters for 3 bytes) and for the padding
// of many small chunks.
const maxTextRequestBytes = rpc.MaxRequestBytes * 3 / 2

// grpcWebText serves the gRPC-Web-text protocol (application/grpc-web-text,
// the encoding browsers without binary streaming use, and grpcwebtext
// clients ask for) in front of h, which speaks gRPC-Web in binary
// (connect-go has no text encoding): it decodes the request body from
// base64, passes the call on as application/grpc-web+<codec>, and encodes
// the answer (messages and the trailer frame alike) back to base64 under
// the text content type. Other requests pass through untouched.
//
// A request body may be several base64 chunks, each padded, as the
// protocol allows; it is read whole, within maxBody bytes (the decoded
// request bound of the API, with base64's overhead), but only once the
// call's credentials authenticate: refusal (rpc.Handler.Refusal) says
// what h's authentication would answer, and a refused call is answered
// so, in gRPC-Web-text, unread. The answer is one base64 stream, padded
// only where the handler flushes mid-stream (a streaming call) and at
// the end.
func grpcWebText(h http.Handler, maxBody int64, refusal func(*http.Request) error) http.Handler {
	refuse := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		codec, ok := strings.CutPrefix(mt, "application/grpc-web-text")
		if err != nil || !ok || (codec != "" && codec[0] != '+') {
			h.ServeHTTP(w, r)
			return
		}
		if codec == "" {
			codec = "+proto"
		}
		if err := refusal(r); err != nil {
			r = r.Clone(r.Context())
			r.Header.Set("Content-Type", "application/grpc-web"+codec)
			tw := &textWriter{w: w, contentType: "application/grpc-web-text" + codec}
			_ = refuse.Write(tw, r, err)
			tw.finish()
			return
		}
		text, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err == nil && int64(len(text)) > maxBody {
			http.Error(w, "grpc-web-text: request body over "+strconv.FormatInt(maxBody, 10)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		var body []byte
		if err == nil {
			body, err = decodeChunks(text)
		}
		if err != nil {
			http.Error(w, "grpc-web-text: the request body is not base64: "+err.Error(), http.StatusBadRequest)
			return
		}
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Type", "application/grpc-web"+codec)
		r.Header.Del("Content-Length")
		tw := &textWriter{w: w, contentType: "application/grpc-web-text" + codec}
		h.ServeHTTP(tw, r)
		tw.finish()
	})
}

// decodeChunks decodes base64 text made of one or more padded chunks
// (standard alphabet; line breaks are skipped, other whitespace refused).
func decodeChunks(text []byte) ([]byte, error) {
	var out []byte
	for len(text) > 0 {
		// A chunk ends after its padding, or at the end of the text.
		end := len(text)
		if i := bytes.IndexByte(text, '='); i >= 0 {
			end = i + 1
			if end < len(text) && text[end] == '=' {
				end++
			}
		}
		dec := make([]byte, base64.StdEncoding.DecodedLen(end))
		n, err := base64.StdEncoding.Decode(dec, text[:end])
		if err != nil {
			return nil, err
		}
		out = append(out, dec[:n]...)
		text = text[end:]
	}
	return out, nil
}

// textWriter base64-encodes what the handler writes, when the handler
// answers gRPC-Web (anything else, a 404 say, passes as it is). It holds
// back the last 0 to 2 bytes of each write (base64 encodes whole groups
// of 3) and writes them, padded, when the handler flushes or ends.
type textWriter struct {
	w           http.ResponseWriter
	contentType string
	wroteHeader bool
	encode      bool // the answer is gRPC-Web, sent as text
	pending     []byte
}

func (t *textWriter) Header() http.Header { return t.w.Header() }

func (t *textWriter) WriteHeader(code int) {
	if t.wroteHeader {
		return
	}
	t.wroteHeader = true
	h := t.w.Header()
	if t.encode = strings.HasPrefix(h.Get("Content-Type"), "application/grpc-web"); t.encode {
		h.Set("Content-Type", t.contentType)
		h.Del("Content-Length")
	}
	t.w.WriteHeader(code)
}

func (t *textWriter) Write(p []byte) (int, error) {
	t.WriteHeader(http.StatusOK)
	if !t.encode {
		return t.w.Write(p)
	}
	buf := append(t.pending, p...)
	whole := len(buf) - len(buf)%3
	if whole > 0 {
		enc := make([]byte, base64.StdEncoding.EncodedLen(whole))
		base64.StdEncoding.Encode(enc, buf[:whole])
		if _, err := t.w.Write(enc); err != nil {
			return 0, err
		}
	}
	t.pending = append([]byte(nil), buf[whole:]...)
	return len(p), nil
}

// writePending writes the held-back bytes, padded.
func (t *textWriter) writePending() {
	if len(t.pending) == 0 {
		return
	}
	enc := make([]byte, base64.StdEncoding.EncodedLen(len(t.pending)))
	base64.StdEncoding.Encode(enc, t.pending)
	t.pending = nil
	_, _ = t.w.Write(enc)
}

// Flush sends what the handler wrote so far (a streaming answer's
// message), padding its last group.
func (t *textWriter) Flush() {
	t.WriteHeader(http.StatusOK)
	t.writePending()
	if f, ok := t.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (t *textWriter) finish() {
	t.WriteHeader(http.StatusOK)
	t.writePending()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (t *textWriter) Unwrap() http.ResponseWriter { return t.w }
