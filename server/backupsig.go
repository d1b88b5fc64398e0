package server

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
)

// SignatureFile is the name, in a signed backup directory, of the
// detached Ed25519 signature of its manifest file (`warden admin backup
// --signing-key`). The manifest holds every file's size and SHA-256, so
// the signature covers the whole backup, the placement state (and the
// auth state in it) included.
const SignatureFile = ManifestFile + ".sig"

// PEM block types of a backup key pair (warden admin backup-key) and of
// a signature file.
const (
	privateKeyBlock = "PRIVATE KEY" // PKCS#8
	publicKeyBlock  = "PUBLIC KEY"  // PKIX
	signatureBlock  = "WARDEN BACKUP SIGNATURE"
	// keyIDHeader, in a signature block, names the key that signed it
	// (KeyID), so a refusal can say which key the backup expects.
	keyIDHeader = "Key-Id"
)

// signedPrefix is prepended to the manifest's bytes before signing, so a
// backup key's signature cannot be passed off as any other message's.
const signedPrefix = "warden backup manifest v1\x00"

// GenerateBackupKey returns a new Ed25519 key pair for signing backups,
// PEM-encoded: the private key as PKCS#8, the public key as PKIX.
func GenerateBackupKey() (private, public []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	pk, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: privateKeyBlock, Bytes: p8}), pem.EncodeToMemory(&pem.Block{Type: publicKeyBlock, Bytes: pk}), nil
}

// ParseBackupPrivateKey parses a PEM PKCS#8 Ed25519 private key (the FILE
// of warden admin backup-key --out FILE). Any other content is an error
// saying what was found.
func ParseBackupPrivateKey(b []byte) (ed25519.PrivateKey, error) {
	return parseKey[ed25519.PrivateKey](b, privateKeyBlock, x509.ParsePKCS8PrivateKey, "private")
}

// ParseBackupPublicKey parses a PEM PKIX Ed25519 public key (FILE.pub of
// warden admin backup-key --out FILE).
func ParseBackupPublicKey(b []byte) (ed25519.PublicKey, error) {
	return parseKey[ed25519.PublicKey](b, publicKeyBlock, x509.ParsePKIXPublicKey, "public")
}

// parseKey parses the PEM block of blockType in b with parse, which must
// give a K (an Ed25519 key; what names which).
func parseKey[K any](b []byte, blockType string, parse func([]byte) (any, error), what string) (K, error) {
	var zero K
	block, _ := pem.Decode(b)
	if block == nil || block.Type != blockType {
		return zero, fmt.Errorf("not a PEM %q block (warden admin backup-key writes one)", blockType)
	}
	k, err := parse(block.Bytes)
	if err != nil {
		return zero, err
	}
	key, ok := k.(K)
	if !ok {
		return zero, fmt.Errorf("a %T, not an Ed25519 %s key", k, what)
	}
	return key, nil
}

// KeyID names a backup public key: the first 8 bytes of the SHA-256 of
// its PKIX encoding, in hex.
func KeyID(pub ed25519.PublicKey) string {
	pk, _ := x509.MarshalPKIXPublicKey(pub) // an Ed25519 key always marshals
	h := sha256.Sum256(pk)
	return hex.EncodeToString(h[:8])
}

// SignManifest returns the contents of a backup's SignatureFile: key's
// signature of manifest (the manifest file's bytes, as written), in a PEM
// block that names the key (KeyID).
func SignManifest(key ed25519.PrivateKey, manifest []byte) []byte {
	sig := ed25519.Sign(key, append([]byte(signedPrefix), manifest...))
	return pem.EncodeToMemory(&pem.Block{Type: signatureBlock, Headers: map[string]string{keyIDHeader: KeyID(key.Public().(ed25519.PublicKey))}, Bytes: sig})
}

// ErrSignature is the error of VerifyManifest for a signature that is
// missing, malformed, by another key, or not of the manifest as it is.
var ErrSignature = errors.New("the backup's signature does not verify")

// VerifyManifest checks sig (a SignatureFile's contents) against
// manifest and key. Every failure wraps ErrSignature and says which:
// malformed, made by another key (both key ids), or not matching the
// manifest's bytes (the manifest or a file's digest in it was changed).
func VerifyManifest(key ed25519.PublicKey, manifest, sig []byte) error {
	block, rest := pem.Decode(sig)
	switch {
	case block == nil || block.Type != signatureBlock:
		return fmt.Errorf("%w: %s is not a PEM %q block", ErrSignature, SignatureFile, signatureBlock)
	case len(block.Bytes) != ed25519.SignatureSize:
		return fmt.Errorf("%w: %s holds %d bytes, not an Ed25519 signature's %d", ErrSignature, SignatureFile, len(block.Bytes), ed25519.SignatureSize)
	case hasBlock(rest):
		return fmt.Errorf("%w: %s holds more than one block", ErrSignature, SignatureFile)
	}
	want := KeyID(key)
	if got := block.Headers[keyIDHeader]; got != want {
		return fmt.Errorf("%w: it was made by key %s, not by the --verify-key given, %s", ErrSignature, got, want)
	}
	if !ed25519.Verify(key, append([]byte(signedPrefix), manifest...), block.Bytes) {
		return fmt.Errorf("%w: %s is not key %s's signature of %s as it is (the manifest, or a file's digest in it, was changed)", ErrSignature, SignatureFile, want, ManifestFile)
	}
	return nil
}

// hasBlock reports whether b holds another PEM block.
func hasBlock(b []byte) bool {
	block, _ := pem.Decode(b)
	return block != nil
}
