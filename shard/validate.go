package shard

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Input bounds (DESIGN.md §3). They are fixed by the API, not shard config.
const (
	// MaxResourceBytes bounds a resource name, in bytes.
	MaxResourceBytes = 256
	// MaxRequestIDBytes bounds a request_id, in bytes.
	MaxRequestIDBytes = 128
	// MaxHolderBytes bounds the free-text holder, in bytes.
	MaxHolderBytes = 256
	// MaxTenantBytes bounds a tenant name, in bytes.
	MaxTenantBytes = 128
	// LeaseIDBytes is the size of a lease id: 128 random bits.
	LeaseIDBytes = 16
)

// FieldError says which request field was refused and why. Its Field is
// the API field name (resource, request_id, lease_ttl, holder, ...).
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// CheckName checks an identifier-like field (resource, request_id, tenant):
// 1..max bytes of valid UTF-8 without control or format characters. It returns a
// *FieldError naming field, or nil.
func CheckName(field, s string, max int) error {
	switch {
	case s == "":
		return &FieldError{field, "is required"}
	case len(s) > max:
		return &FieldError{field, fmt.Sprintf("is %d bytes, more than %d", len(s), max)}
	}
	return checkText(field, s)
}

// CheckText checks an optional free-text field (holder): at most max bytes
// of valid UTF-8 without control or format characters. It returns a *FieldError or nil.
func CheckText(field, s string, max int) error {
	if len(s) > max {
		return &FieldError{field, fmt.Sprintf("is %d bytes, more than %d", len(s), max)}
	}
	return checkText(field, s)
}

func checkText(field, s string) error {
	if !utf8.ValidString(s) {
		return &FieldError{field, "is not valid UTF-8"}
	}
	for _, r := range s {
		if forbidden(r) {
			return &FieldError{field, fmt.Sprintf("contains control or format character %U", r)}
		}
	}
	return nil
}

// forbidden reports runes that may not appear in names or holder text:
// control characters (Cc), invisible format characters such as bidi
// overrides and zero-width spaces (Cf), line and paragraph separators
// (Zl, Zp) and noncharacters. They make names that look alike but differ,
// and let free text spoof audit logs.
func forbidden(r rune) bool {
	if r < utf8.RuneSelf {
		// The only such ASCII runes are the C0 controls and DEL (Cc):
		// decided without unicode.In's table search, which was 2 % of
		// every replica's CPU at the reference load (it runs on every
		// rune of every name).
		return r < 0x20 || r == 0x7f
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) ||
		(r >= 0xFDD0 && r <= 0xFDEF) || r&0xFFFE == 0xFFFE
}

// LogText is s made safe to write in a log line or an error message
// whose reader did not choose it (a refused call's resource, holder or
// tenant, which no validation has passed): cut to at most max bytes of s
// at a rune boundary, with "…(+N bytes)" naming the N bytes cut, and
// every rune CheckText forbids, every invalid byte written as a \u or \x escape
// (a backslash or a double quote after a backslash, so that the text
// can be quoted), so that the text can neither reorder,
// hide or break the line it is written in nor pass as another text.
func LogText(s string, max int) string {
	cut := len(s)
	if cut > max {
		cut = max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
	}
	var b strings.Builder
	for i := 0; i < cut; {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\' || r == '"':
			b.WriteByte('\\')
			b.WriteRune(r)
		case forbidden(r):
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	if cut < len(s) {
		fmt.Fprintf(&b, "…(+%d bytes)", len(s)-cut)
	}
	return b.String()
}
