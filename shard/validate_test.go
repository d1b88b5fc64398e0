package shard

import (
	"testing"
	"unicode"
)

// TestForbiddenASCII: the ASCII shortcut decides every ASCII rune as the
// Unicode categories do, and the rest still go through them.
func TestForbiddenASCII(t *testing.T) {
	for r := rune(0); r < 0x80; r++ {
		if want := unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp); forbidden(r) != want {
			t.Errorf("forbidden(%U) = %v, want %v", r, !want, want)
		}
	}
	for r, want := range map[rune]bool{0x85: true, 0xAD: true, 0x200B: true, 0x202E: true, 0x2028: true, 0xFDD0: true, 0x1FFFE: true, 'é': false, '日': false} {
		if forbidden(r) != want {
			t.Errorf("forbidden(%U) = %v, want %v", r, !want, want)
		}
	}
}
