package testenv

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP fault proxy for tests: it forwards 127.0.0.1:port to a
// target and can cut, refuse, delay or throttle the traffic on command.
// Put it in front of PostgreSQL (the client connects where it is told).
// Kafka clients reconnect to the addresses the broker advertises, so for
// the broker use kfake's own controls instead.
type Proxy struct {
	target string
	ln     net.Listener

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	refuse   bool
	delay    time.Duration
	bytesPer time.Duration // per KiB, throttling
	closed   bool
	wg       sync.WaitGroup
}

// NewProxy starts a proxy to target; it is closed when the test ends.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy listen: %v", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept() // ends when the listener is closed
	tb.Cleanup(p.Close)
	return p
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore accepts and forwards connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
}

// Delay holds every forwarded chunk for d (0: none).
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Throttle limits forwarding to one KiB per perKiB (0: unlimited).
func (p *Proxy) Throttle(perKiB time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bytesPer = perKiB
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c) // each ends when either side closes
		go p.pipe(c, up)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, per := p.delay, p.bytesPer
			p.mu.Unlock()
			if wait := delay + time.Duration(n/1024)*per; wait > 0 {
				time.Sleep(wait) // the fault being injected, not synchronisation
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a cut: either way this direction is done
			return
		}
	}
}
