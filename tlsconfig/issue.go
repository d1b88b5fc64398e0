package tlsconfig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// CA is a certificate authority held in memory, to issue throwaway
// certificates: for tests, and for a local secure cluster. Production
// certificates come from the operator's own CA.
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
	// PEM is Cert, PEM-encoded (what --peer-ca or --tls-client-ca reads).
	PEM []byte
}

// NewCA returns a self-signed CA named commonName, valid for validFor
// from now (less a minute, for clocks a little behind).
func NewCA(commonName string, validFor time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"Warden"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// CertSpec is what a certificate Issue signs says.
type CertSpec struct {
	// CommonName is the subject's CN (a principal, for a client).
	CommonName string
	// Names are its DNS names and IP addresses (subject alternative
	// names): a server's hosts, a node's NodeName.
	Names []string
	// URIs are URI subject alternative names (a SPIFFE id).
	URIs []string
	// NotBefore and NotAfter bound its validity; a zero NotBefore is a
	// minute ago, a zero NotAfter a year from now.
	NotBefore, NotAfter time.Time
	// Server and Client are the uses it may serve (extended key usages).
	Server, Client bool
}

// Issue signs a certificate for spec with a new P-256 key, and returns
// both PEM-encoded.
func (ca *CA) Issue(spec CertSpec) (certPEM, keyPEM []byte, err error) {
	if !spec.Server && !spec.Client {
		return nil, nil, errors.New("tls: a certificate for neither server nor client use")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if spec.NotBefore.IsZero() {
		spec.NotBefore = time.Now().Add(-time.Minute)
	}
	if spec.NotAfter.IsZero() {
		spec.NotAfter = time.Now().AddDate(1, 0, 0)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: spec.CommonName},
		NotBefore:    spec.NotBefore,
		NotAfter:     spec.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if spec.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if spec.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, n := range spec.Names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	for _, u := range spec.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			return nil, nil, fmt.Errorf("tls: URI %q: %w", u, err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// serial is a random 128-bit certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return n
}
