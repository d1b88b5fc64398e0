package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/alecthomas/kong"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Exit statuses of warden, one per kind of outcome a script tells apart
// (docs/api.md "The CLI"; warden --help lists them). warden lock
// run has its own for the child (runStatus).
const (
	exitOK           = 0
	exitInternal     = 1   // internal or unknown
	exitUsage        = 2   // bad usage, invalid_argument
	exitUnavailable  = 3   // unavailable, unreachable, the call's own deadline: retry with the same request id
	exitHeld         = 4   // the lock is held (aborted), or a --wait ended without it
	exitExhausted    = 5   // resource_exhausted: quota, a full wait queue, a request too large
	exitPrecondition = 6   // failed_precondition, not_found, out_of_range: lease not current, reservation ended, unknown shard, a watch cursor no longer served
	exitDenied       = 7   // unauthenticated, permission_denied
	exitInterrupted  = 130 // SIGINT (128 + 2, as shells report it)
)

// exitHelp is the exit status table warden --help shows.
const exitHelp = `Exit status: 0 ok; 1 internal or unknown error; 2 bad usage or invalid_argument; 3 unavailable, unreachable or --timeout passed (retry with the same --request-id); 4 the lock is held (or a --wait ended without it); 5 resource_exhausted (quota, a full wait queue, a request too large); 6 failed_precondition, not_found or out_of_range (a lease no longer current, a reservation ended, an unknown shard, a watch cursor no longer served); 7 unauthenticated or permission_denied; 130 interrupted. warden lock run: the command's own status, 124 when the lease was lost and the command stopped, 125 when lock run failed before starting it, 126 not executable, 127 not found. With --json, an error is also JSON on stderr: {"code", "message", "details"}.`

// exitError is an error with the exit status it ends warden with (err
// nil: a status that says all, printed as nothing).
type exitError struct {
	status int
	err    error
}

// Error is err's message; an exitError without err (warden lock run
// passing on its command's status) prints nothing.
func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.status)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

// usage marks err as bad usage (exit 2).
func usage(err error) error { return &exitError{status: exitUsage, err: err} }

// errInterrupted: SIGINT or SIGTERM ended the command.
var errInterrupted = errors.New("interrupted")

// exitStatus is the status warden exits with after err.
func exitStatus(err error) int {
	var ee *exitError
	var pe *kong.ParseError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.status
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	case errors.As(err, &pe):
		return exitUsage
	case errors.Is(err, context.DeadlineExceeded):
		return exitUnavailable
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument:
		return exitUsage
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
		return exitUnavailable
	case connect.CodeAborted:
		return exitHeld
	case connect.CodeResourceExhausted:
		return exitExhausted
	case connect.CodeFailedPrecondition, connect.CodeNotFound, connect.CodeOutOfRange:
		return exitPrecondition
	case connect.CodeUnauthenticated, connect.CodePermissionDenied:
		return exitDenied
	case connect.CodeCanceled:
		return exitInterrupted
	}
	return exitInternal
}

// jsonError is how --json prints an error on stderr.
type jsonError struct {
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details"`
}

// printError writes err to w: "warden: message" with the details of a
// Connect error, or with asJSON one line of JSON whose code is the
// Connect code's name ("unavailable"; "unknown" for an error of no code
// but bad usage, "invalid_argument") and whose details are the error
// details in protobuf JSON, each with its "@type".
func printError(w io.Writer, err error, asJSON bool) {
	if !asJSON {
		fmt.Fprintln(w, "warden:", describeErr(err))
		return
	}
	out := jsonError{Code: connect.CodeOf(err).String(), Message: describeErr(err), Details: []json.RawMessage{}}
	if exitStatus(err) == exitUsage && connect.CodeOf(err) == connect.CodeUnknown {
		out.Code = connect.CodeInvalidArgument.String()
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		for _, d := range ce.Details() {
			v, derr := d.Value()
			if derr != nil {
				continue
			}
			if b, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(anyOf(v)); err == nil {
				out.Details = append(out.Details, b)
			}
		}
	}
	b, _ := json.Marshal(out)
	fmt.Fprintln(w, string(b))
}

// anyOf wraps detail v in an Any, so its JSON names its type ("@type").
func anyOf(v proto.Message) proto.Message {
	a, err := anypb.New(v)
	if err != nil {
		return v
	}
	return a
}
