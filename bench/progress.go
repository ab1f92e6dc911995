package main

import (
	"fmt"
	"io"
	"sync"
)

// progress rewrites one status line on a terminal; it prints nothing when
// disabled, so that a redirected stderr stays clean.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	on    bool
	width int
}

func newProgress(w io.Writer, on bool) *progress { return &progress{w: w, on: on} }

func (p *progress) printf(format string, args ...any) {
	if p == nil || !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := fmt.Sprintf(format, args...)
	pad := max(0, p.width-len(s))
	fmt.Fprintf(p.w, "\r%s%*s", s, pad, "")
	p.width = len(s)
}

// done clears the line.
func (p *progress) done() {
	if p == nil || !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.width > 0 {
		fmt.Fprintf(p.w, "\r%*s\r", p.width, "")
		p.width = 0
	}
}
