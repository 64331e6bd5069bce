package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaSASL starts an in-process kfake cluster with one broker that
// requires SASL on every connection, with one superuser (mechanism is
// PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512), and the given topics. It returns
// the cluster and its bootstrap address; the cluster is closed when the
// test ends. Clients connect with security.protocol=SASL_PLAINTEXT.
func KafkaSASL(tb testing.TB, partitions int32, mechanism, user, password string, topics ...string) (*kfake.Cluster, string) {
	tb.Helper()
	return startKafka(tb, partitions, topics, kfake.EnableSASL(), kfake.Superuser(mechanism, user, password))
}

// KafkaTLS starts an in-process kfake cluster with one broker that speaks
// only TLS, with a fresh self-signed certificate for 127.0.0.1 and
// localhost, and the given topics. It returns the cluster, its bootstrap
// address and the certificate in PEM (the CA clients must trust, for
// ssl.ca.pem or ssl.ca.location). The cluster is closed when the test
// ends. Clients connect with security.protocol=SSL.
func KafkaTLS(tb testing.TB, partitions int32, topics ...string) (*kfake.Cluster, string, []byte) {
	tb.Helper()
	cert, caPEM := SelfSignedCert(tb, "127.0.0.1", "localhost")
	c, addr := startKafka(tb, partitions, topics,
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	return c, addr, caPEM
}

// SelfSignedCert makes a self-signed ECDSA P-256 server certificate, valid
// for an hour, for the given IP addresses and DNS names. It returns the
// certificate with its key and the certificate in PEM.
func SelfSignedCert(tb testing.TB, hosts ...string) (tls.Certificate, []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("generate key: %v", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatalf("serial: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: hosts[0], Organization: []string{"ratchet test"}},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("create certificate: %v", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("marshal key: %v", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatalf("key pair: %v", err)
	}
	return cert, certPEM
}

func startKafka(tb testing.TB, partitions int32, topics []string, extra ...kfake.Opt) (*kfake.Cluster, string) {
	tb.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation()}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	c, err := kfake.NewCluster(append(opts, extra...)...)
	if err != nil {
		tb.Fatalf("start kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	if len(addrs) == 0 {
		tb.Fatal("kfake has no listen address")
	}
	return c, addrs[0]
}
