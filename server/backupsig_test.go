package server

import (
	"bytes"
	"crypto/ed25519"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
)

// testBackupKey returns a new backup key pair, parsed from the PEM that
// GenerateBackupKey writes.
func testBackupKey(t testing.TB) (ed25519.PrivateKey, ed25519.PublicKey) {
	private, public, err := GenerateBackupKey()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ParseBackupPrivateKey(private)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ParseBackupPublicKey(public)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// A manifest signed by a key verifies with its public key, and with no
// other; any changed byte of the manifest, and any damaged or foreign
// signature file, is refused as ErrSignature, saying what is wrong.
func TestVerifyManifest(t *testing.T) {
	priv, pub := testBackupKey(t)
	_, other := testBackupKey(t)
	manifest := []byte(`{"backup_id": "b1", "placement": {"sha256": "AAAA"}}` + "\n")
	sig := SignManifest(priv, manifest)
	if err := VerifyManifest(pub, manifest, sig); err != nil {
		t.Fatalf("the signature of an unchanged manifest: %v", err)
	}
	block, _ := pem.Decode(sig)
	reblock := func(f func(b *pem.Block)) []byte {
		b := &pem.Block{Type: block.Type, Headers: map[string]string{keyIDHeader: block.Headers[keyIDHeader]}, Bytes: bytes.Clone(block.Bytes)}
		f(b)
		return pem.EncodeToMemory(b)
	}
	flipped := bytes.Clone(manifest)
	flipped[len(flipped)/2] ^= 0x01
	for _, tc := range []struct {
		name     string
		key      ed25519.PublicKey
		manifest []byte
		sig      []byte
		want     string
	}{
		{"a flipped byte of the manifest", pub, flipped, sig, "was changed"},
		{"another key", other, manifest, sig, "not by the --verify-key given"},
		{"an empty file", pub, manifest, nil, "not a PEM"},
		{"another PEM block", pub, manifest, reblock(func(b *pem.Block) { b.Type = "PUBLIC KEY" }), "not a PEM"},
		{"a short signature", pub, manifest, reblock(func(b *pem.Block) { b.Bytes = b.Bytes[:10] }), "not an Ed25519 signature's 64"},
		{"a flipped signature bit", pub, manifest, reblock(func(b *pem.Block) { b.Bytes[3] ^= 0x80 }), "was changed"},
		{"a forged key id", pub, manifest, reblock(func(b *pem.Block) { b.Headers[keyIDHeader] = "00" }), "made by key 00"},
		{"no key id", pub, manifest, reblock(func(b *pem.Block) { b.Headers = nil }), "made by key ,"},
		{"two blocks", pub, manifest, append(bytes.Clone(sig), sig...), "more than one block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := VerifyManifest(tc.key, tc.manifest, tc.sig)
			if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("VerifyManifest = %v; want ErrSignature saying %q", err, tc.want)
			}
		})
	}
}

// Key files that are not a backup key pair are errors saying what they
// hold, never a panic.
func TestParseBackupKeys(t *testing.T) {
	private, public, err := GenerateBackupKey()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseBackupPrivateKey(public); err == nil {
		t.Error("a public key parsed as a private key")
	}
	if _, err := ParseBackupPublicKey(private); err == nil {
		t.Error("a private key parsed as a public key")
	}
	for _, b := range [][]byte{nil, []byte("garbage"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}})} {
		if _, err := ParseBackupPublicKey(b); err == nil {
			t.Errorf("ParseBackupPublicKey(%q) succeeded", b)
		}
		if _, err := ParseBackupPrivateKey(b); err == nil {
			t.Errorf("ParseBackupPrivateKey(%q) succeeded", b)
		}
	}
}

// Any signature file, manifest or public key file: an error or success,
// never a panic, and never success for a manifest the key did not sign.
func FuzzVerifyManifest(f *testing.F) {
	priv, pub := testBackupKey(f)
	manifest := []byte(`{"backup_id": "b1"}`)
	f.Add(manifest, SignManifest(priv, manifest), []byte(nil))
	f.Add([]byte("x"), []byte("-----BEGIN WARDEN BACKUP SIGNATURE-----\nKey-Id: 1\n\nAAAA\n-----END WARDEN BACKUP SIGNATURE-----\n"), []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"))
	f.Fuzz(func(t *testing.T, m, sig, keyFile []byte) {
		key := pub
		if len(keyFile) > 0 {
			k, err := ParseBackupPublicKey(keyFile)
			if err != nil {
				return
			}
			key = k
		}
		_, _ = ParseBackupPrivateKey(keyFile)
		if VerifyManifest(key, m, sig) == nil && bytes.Equal(key, pub) && !bytes.Equal(m, manifest) {
			t.Fatalf("a signature verified for a manifest the key never signed: %q", m)
		}
	})
}
