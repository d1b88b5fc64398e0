//go:build linux

package nemesis

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// proxy carries every node-to-node connection: each node advertises, for
// its Raft transport and its node API, an address of the proxy in the
// root namespace, which forwards to the address the node binds in its
// namespace. A connection's source node is known by its source address
// (its namespace's), its destination by the port it came in on. So a
// partition, a delay or a drop is a proxy rule, and a client in the root
// namespace that calls a node's bound address directly is not affected.
type proxy struct {
	host  string         // the bridge's address, where the proxy listens
	nodes map[string]int // a node's namespace address → its index

	mu     sync.Mutex
	cut    map[[2]int]bool // unordered pairs (lower index first) that see each other not
	faults map[string]linkFaults
	conns  map[*pconn]bool
	rng    *rand.Rand
	lns    []net.Listener
	wg     sync.WaitGroup
}

// linkFaults degrade every connection of one kind ("raft" or "api").
type linkFaults struct {
	// delay holds each chunk this long, plus up to jitter more (the
	// chunks of one connection keep their order).
	delay, jitter time.Duration
	// drop is the chance that a chunk is lost with its connection: the
	// proxy closes both sides instead of forwarding it.
	drop float64
}

// pconn is one proxied connection.
type pconn struct {
	from, to int // node indices; from is -1 for a caller that is no node
	kind     string
	down, up net.Conn // the caller's side and the node's (nil until dialed)
	held     bool     // accepted while its pair was cut: never forwarded
	once     sync.Once
}

func (c *pconn) close() {
	c.once.Do(func() {
		c.down.Close()
		if c.up != nil {
			c.up.Close()
		}
	})
}

func newProxy(host string, nodes []string, seed uint64) *proxy {
	p := &proxy{host: host, nodes: map[string]int{}, cut: map[[2]int]bool{}, faults: map[string]linkFaults{},
		conns: map[*pconn]bool{}, rng: rand.New(rand.NewPCG(seed, 41))}
	for i, n := range nodes {
		p.nodes[n] = i
	}
	return p
}

func pair(a, b int) [2]int { return [2]int{min(a, b), max(a, b)} }

// listen opens a proxy port that forwards to node to's target address
// (of kind "raft" or "api") and returns the port's address.
func (p *proxy) listen(to int, kind, target string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(p.host, "0"))
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	p.lns = append(p.lns, ln)
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from := -1
			if host, _, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil {
				if i, ok := p.nodes[host]; ok {
					from = i
				}
			}
			p.wg.Go(func() { p.serve(&pconn{from: from, to: to, kind: kind, down: c}, target) })
		}
	})
	return ln.Addr().String(), nil
}

// blocked reports whether the pair from, to is cut (mu held).
func (p *proxy) blocked(from, to int) bool { return from >= 0 && from != to && p.cut[pair(from, to)] }

// serve forwards c to target, or holds it (a black hole: accepted, never
// answered) while its pair is cut, until setCuts heals the pair or cuts
// it anew.
func (p *proxy) serve(c *pconn, target string) {
	p.mu.Lock()
	p.conns[c] = true
	c.held = p.blocked(c.from, c.to)
	held := c.held
	p.mu.Unlock()
	defer func() {
		c.close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	if held {
		_, _ = io.Copy(io.Discard, c.down) // until a heal closes it
		return
	}
	up, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return
	}
	p.mu.Lock()
	if !p.conns[c] || p.blocked(c.from, c.to) { // cut while dialing
		p.mu.Unlock()
		up.Close()
		return
	}
	c.up = up
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(c, c.down, up) })
	wg.Go(func() { p.pump(c, up, c.down) })
	wg.Wait()
}

// chunk is bytes read from one side, due to be written at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst chunk by chunk, applying the connection kind's
// faults; it closes the connection when either side ends.
func (p *proxy) pump(c *pconn, src, dst net.Conn) {
	defer c.close()
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(ch.b); err != nil {
				c.close()
				for range q { // drain until the reader ends
				}
				return
			}
		}
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			f := p.faults[c.kind]
			lost := f.drop > 0 && p.rng.Float64() < f.drop
			var extra time.Duration
			if f.jitter > 0 {
				extra = time.Duration(p.rng.Int64N(int64(f.jitter)))
			}
			p.mu.Unlock()
			if lost {
				c.close()
				break
			}
			due := time.Now().Add(f.delay + extra)
			if due.Before(last) {
				due = last
			}
			last = due
			q <- chunk{b: buf[:n], due: due}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
}

// setCuts makes pairs (unordered node index pairs) the cut ones: every
// connection of a newly cut pair is closed at once (a held one of a
// still cut pair stays held), and every held connection of a healed
// pair is closed, so that its caller dials again through the proxy.
func (p *proxy) setCuts(pairs ...[2]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cut := map[[2]int]bool{}
	for _, pr := range pairs {
		cut[pair(pr[0], pr[1])] = true
	}
	p.cut = cut
	for c := range p.conns {
		if c.from < 0 || c.from == c.to {
			continue
		}
		if cut[pair(c.from, c.to)] != c.held {
			delete(p.conns, c)
			c.close()
		}
	}
}

// setFaults sets the faults of every connection of kind ("raft" or
// "api"); the zero linkFaults clears them.
func (p *proxy) setFaults(kind string, f linkFaults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults[kind] = f
}

// close stops the proxy: its ports and every connection.
func (p *proxy) close() {
	p.mu.Lock()
	for _, ln := range p.lns {
		ln.Close()
	}
	for c := range p.conns {
		c.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
