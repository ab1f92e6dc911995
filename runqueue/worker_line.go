package runqueue

import (
	"slices"
	"sync"
)

// envLine (flag off) is a Queue's own waiting line for an env's limit, in
// this process: the queue sources of one env of all the Queue's Workers
// (when they have two or more) whose last call for runs got none while its
// look found ready runs and the env at its limit (not the queue at its
// own). With the flag off no waiting line in Redis wakes such a queue (the
// pinned flag-off scripts keep none), and nothing else may: a queue the
// env held waited for its look (BlockPollInterval) while another queue of
// the same process freed the env (helper-209's shape, flag off: 29.6 s at
// a 30 s poll, twice a run, the third queue on a Worker of its own).
//
// A call of one of these sources that frees slots of the env it does not
// take again (it got fewer runs than it acked, or it carried acks alone)
// wakes as many sources of the line, the longest held first; each makes
// one call and is served or, held again, joins at the back. A held call
// that was on its way while such a release was made may have run in Redis
// before it: the source asks again at once rather than join (released
// counts the releases for that). Only the Queue's own Workers' releases
// wake its line: slots freed by other processes (or other Queues), by a
// shard source, a DequeueWait or a plain Ack, wait for the look, as
// before.
type envLine struct {
	mu       sync.Mutex
	released int64     // the releases made so far
	acking   int       // the calls with acks of its sources on their way
	members  []*source // the sources whose loops run (see Queue.enterLine)
	waiting  []*source // in the order they joined
}

// enterLine: s's loop begins to call for runs (a queue source of a
// flag-off Worker: with the flag on the env's waiting line in Redis wakes
// the queues it held, in every process). s counts in its Queue's line for
// its env, made for the first such source, until exitLine; looks read the
// counts the line needs only while it has two or more (sharedFor). When s
// makes the line shared, the source that called alone until now looks
// again (relook) if its last look was taken alone (lookedAlone, see
// sharedFor) and it does not wait in the line: that look read no counts,
// so a queue the env held stayed out of the line, and s's releases would
// not wake it (helper-216's G3: it waited for its poll). (helper-217: a
// source whose first call has not answered yet looks with the counts;
// asked, it made one call more at every such start.) The nudge is sent
// under mu, after s counts, so a look of that source's either came after
// it (and found the line shared) or is followed by the nudge; a token
// pending already (a wake-up's) is left as it is: the source looks again
// for it anyway.
func (q *Queue) enterLine(s *source) {
	q.linesMu.Lock()
	defer q.linesMu.Unlock()
	e := q.lines[s.env]
	if e == nil {
		if q.lines == nil {
			q.lines = map[string]*envLine{}
		}
		e = &envLine{}
		q.lines[s.env] = e
	}
	e.mu.Lock()
	e.members = append(e.members, s)
	if len(e.members) == 2 {
		if o := e.members[0]; !o.inLine && o.lookedAlone {
			select {
			case o.nudged <- struct{}{}:
				o.relook = true
			default:
			}
		}
	}
	e.mu.Unlock()
	s.line = e
}

// exitLine: s's loop ended: it counts in its line no more, and the line
// goes with its last member (helper-214: a Queue whose Workers come and go
// over many envs kept a line for each).
func (q *Queue) exitLine(s *source) {
	q.linesMu.Lock()
	defer q.linesMu.Unlock()
	e := s.line
	e.mu.Lock()
	e.members = slices.DeleteFunc(e.members, func(o *source) bool { return o == s })
	last := len(e.members) == 0
	e.mu.Unlock()
	if last && q.lines[s.env] == e {
		delete(q.lines, s.env)
	}
}

// sharedFor: two or more sources call for runs, so one may wake another
// (a look of s's then reads the counts). s.lookedAlone notes a look that
// reads none, which the entry making the line shared asks again
// (enterLine; a source whose first call has not answered yet looks with
// the counts then, and is not asked).
func (e *envLine) sharedFor(s *source) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s.lookedAlone = len(e.members) < 2
	return !s.lookedAlone
}

// nudgedFor says what a nudge s got was for: true, a wake-up of the line
// (wake); false, a look again asked by enterLine, no wake-up (one that
// took nothing passes nothing on: envLine.pass). A wake-up after the
// relook's nudge, which its token carries, is the line's.
func (e *envLine) nudgedFor(s *source) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	woken := !s.relook
	s.relook = false
	return woken
}

// quit: s calls for runs no more (its Worker stops, or its loop ended). It
// leaves the line; woken: a wake-up of the line came to it that no call of
// its used, which goes on (pass) rather than be lost with it (helper-214).
// A nudge still in s.nudged is taken under mu, after s left the waiting
// line, so none can come after it (wake sends under mu).
func (e *envLine) quit(s *source, woken bool) {
	e.mu.Lock()
	e.out(s)
	select {
	case <-s.nudged:
		woken = woken || !s.relook // (a look again asked is no wake-up)
	default:
	}
	s.relook = false
	e.mu.Unlock()
	if woken {
		e.pass(s, true)
	}
}

// leave takes s out of the line (it calls for runs now, or stops) and
// returns the releases so far, which its call notes (fetchCall.released).
func (e *envLine) leave(s *source) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.out(s)
	return e.released
}

// out takes s out of the waiting line, if it waits there (under mu).
func (e *envLine) out(s *source) {
	if s.inLine {
		s.inLine = false
		e.waiting = slices.DeleteFunc(e.waiting, func(o *source) bool { return o == s })
	}
}

// joined is what join did.
type joined int

const (
	lineJoined  joined = iota // s waits in the line
	lineCrossed               // a release was made since s's call began: s asks again
	lineOut                   // the env was free and no acks of the line are on their way: s stays out
)

// join puts s at the back of the line, unless a release was made since its
// call began (released, as leave returned it). free: s's look found the
// env below its limit (acks ran in Redis after s's call): s joins only
// while calls with acks of the line are on their way, whose release may
// be it (a queue its key limits hold, the env free, would otherwise spend
// the line's wake-ups). limit: the env's limit for s's queue (see
// passAbove).
func (e *envLine) join(s *source, released int64, free bool, limit int) joined {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.released != released:
		return lineCrossed
	case free && e.acking == 0:
		return lineOut
	}
	if !s.inLine {
		s.inLine = true
		e.waiting = append(e.waiting, s)
	}
	s.lineHeld, s.lineLimit = !free, limit
	return lineJoined
}

// acks counts a call with acks of a source of the line on its way (d +1 at
// its launch, -1 once its reply was processed, its release made).
func (e *envLine) acks(d int) {
	e.mu.Lock()
	e.acking += d
	e.mu.Unlock()
}

// release notes that a call of from freed n slots of the env it did not
// take again, and wakes up to n of the sources waiting, the longest held
// first (from itself stays: its own reply tells it).
func (e *envLine) release(from *source, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.released++
	for i := 0; i < len(e.waiting) && n > 0; {
		if e.waiting[i] == from {
			i++
			continue
		}
		e.wake(i)
		n--
	}
}

// wake takes the i-th source waiting out of the line and wakes it.
func (e *envLine) wake(i int) {
	s := e.waiting[i]
	e.waiting = slices.Delete(e.waiting, i, i+1)
	s.inLine = false
	s.relook = false // (the token, sent or pending, is this wake-up's now)
	select {
	case s.nudged <- struct{}{}:
	default:
	}
}

// pass: a source the line woke could not take the slot it was woken for
// (its key limits hold it, say) and its look found the env with room, or
// it stops (quit) with the wake-up unused: the wake-up goes to the first
// source waiting that joined on a look finding the env at its limit, other
// than from. One that joined on a free look is owed none (two such would
// pass it back and forth while acks flow), unless from stops (it calls no
// more, so nothing comes back to it) and no held one waits: then the first
// that joined on a free look gets it (it waits for a release this may have
// been). It counts as a release (a held call crossing it asks again).
func (e *envLine) pass(from *source, stops bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := slices.IndexFunc(e.waiting, func(o *source) bool { return o != from && o.lineHeld })
	if i < 0 && stops {
		i = slices.IndexFunc(e.waiting, func(o *source) bool { return o != from })
	}
	if i < 0 {
		return
	}
	e.released++
	e.wake(i)
}

// passAbove: a source the line woke found the env's count at or above
// its own queue's env limit, count: LimitsFor gives the env's queues
// different limits, and the slot freed may fit a waiter whose queue has a
// higher one (helper-219's F3: a release woke a queue limited to 1 at a
// count of 2, which joined again, while a queue limited to 3 behind it
// waited for its poll). The wake-up goes to the first such waiter that
// joined on a look finding the env at its limit, other than from (its
// limit as it joined): not to one that joined on a free look, which, its
// key limits holding it, would pass it back (pass) for as long as acks
// are on their way. It counts as a release.
func (e *envLine) passAbove(from *source, count int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := slices.IndexFunc(e.waiting, func(o *source) bool {
		return o != from && o.lineHeld && int64(o.lineLimit) > count
	})
	if i < 0 {
		return
	}
	e.released++
	e.wake(i)
}

// acksLost: a call of from with acks of the line on their way failed with
// no word whether they ran (helper-216: its acks(-1) then left the sources
// that joined on a free look, which wait for those acks' release alone, to
// their poll). When it was the last such call, they are woken to look
// again (each asks once; found free again with no acks on their way, it
// stays out: envLine.join). Called before the call's acks(-1).
func (e *envLine) acksLost(from *source) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.acking > 1 {
		return // other acks are on their way: their release may be it
	}
	woke := false
	for i := 0; i < len(e.waiting); {
		if o := e.waiting[i]; o != from && !o.lineHeld {
			e.wake(i)
			woke = true
			continue
		}
		i++
	}
	if woke {
		e.released++
	}
}
