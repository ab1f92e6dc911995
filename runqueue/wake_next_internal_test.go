package runqueue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// blockingRead is a read of the next work time that waits for release and
// then answers score (or err), counting its calls.
type blockingRead struct {
	calls   atomic.Int32
	release chan struct{}
	score   float64
	err     error
}

func newBlockingRead(score float64) *blockingRead {
	return &blockingRead{release: make(chan struct{}), score: score}
}

func (b *blockingRead) read() (*redis.ZSliceCmd, error) {
	b.calls.Add(1)
	<-b.release
	if b.err != nil {
		return nil, b.err
	}
	return redis.NewZSliceCmdResult([]redis.Z{{Score: b.score}}, nil), nil
}

type nextOutcome struct {
	z   []redis.Z
	err error
}

// future takes every shared answer whose score is above 10 (a time to
// come in these tests) or that is empty.
func future(z []redis.Z) bool { return len(z) == 0 || z[0].Score > 10 }

func nextAsync(ctx context.Context, w *waker, topic string, since time.Time, read func() (*redis.ZSliceCmd, error)) <-chan nextOutcome {
	out := make(chan nextOutcome, 1)
	go func() {
		z, err := w.next(ctx, topic, since, since, read, future)
		out <- nextOutcome{z, err}
	}()
	return out
}

// inFlight waits until topic has a read in flight and returns it.
func inFlight(t *testing.T, w *waker, topic string) *nextRead {
	t.Helper()
	var r *nextRead
	require.Eventually(t, func() bool {
		w.readMu.Lock()
		defer w.readMu.Unlock()
		r = w.reads[topic]
		return r != nil
	}, 5*time.Second, time.Millisecond)
	return r
}

// awaitJoined waits until n callers have joined r.
func awaitJoined(t *testing.T, w *waker, r *nextRead, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		w.readMu.Lock()
		defer w.readMu.Unlock()
		return r.joined == n
	}, 5*time.Second, time.Millisecond)
}

// Waiters that began their look before a read of their topic started
// share it; one that began after it reads itself; other topics read
// apart; nothing is left in flight.
func TestWakerNextShared(t *testing.T) {
	w := &waker{}
	ctx := context.Background()
	first := newBlockingRead(42)
	since := time.Now()
	a := nextAsync(ctx, w, "t", since, first.read)
	r := inFlight(t, w, "t")
	joiner := newBlockingRead(0)
	b := nextAsync(ctx, w, "t", since, joiner.read)
	awaitJoined(t, w, r, 1)
	late := newBlockingRead(7)
	c := nextAsync(ctx, w, "t", r.start.Add(time.Nanosecond), late.read)
	other := newBlockingRead(9)
	d := nextAsync(ctx, w, "u", since, other.read)
	require.Eventually(t, func() bool { return late.calls.Load() == 1 && other.calls.Load() == 1 }, 5*time.Second, time.Millisecond)
	close(first.release)
	for _, ch := range []<-chan nextOutcome{a, b} {
		o := <-ch
		require.NoError(t, o.err)
		require.Equal(t, []redis.Z{{Score: 42}}, o.z)
	}
	require.Zero(t, joiner.calls.Load(), "the joiner did not read")
	close(late.release)
	close(other.release)
	require.Equal(t, 7.0, (<-c).z[0].Score, "began its look after the read started: read itself")
	require.Equal(t, 9.0, (<-d).z[0].Score)
	require.Eventually(t, func() bool {
		w.readMu.Lock()
		defer w.readMu.Unlock()
		return len(w.reads) == 0
	}, 5*time.Second, time.Millisecond)
}

// A read that failed (its starter's context ended, say) or panicked is no
// answer for those that joined it: they read themselves. A joiner whose
// context ends stops waiting.
func TestWakerNextFailedRead(t *testing.T) {
	w := &waker{}
	ctx := context.Background()
	since := time.Now()

	failing := newBlockingRead(0)
	failing.err = context.Canceled
	a := nextAsync(ctx, w, "t", since, failing.read)
	rf := inFlight(t, w, "t")
	own := newBlockingRead(5)
	close(own.release)
	b := nextAsync(ctx, w, "t", since, own.read)
	awaitJoined(t, w, rf, 1)
	close(failing.release)
	require.ErrorIs(t, (<-a).err, context.Canceled)
	o := <-b
	require.NoError(t, o.err)
	require.Equal(t, 5.0, o.z[0].Score)
	require.Equal(t, int32(1), own.calls.Load())

	panicking := make(chan struct{})
	go func() {
		defer func() { _ = recover() }()
		_, _ = w.next(ctx, "p", since, since, func() (*redis.ZSliceCmd, error) {
			<-panicking
			panic("read boom")
		}, future)
	}()
	rp := inFlight(t, w, "p")
	own2 := newBlockingRead(6)
	close(own2.release)
	c := nextAsync(ctx, w, "p", since, own2.read)
	awaitJoined(t, w, rp, 1)
	close(panicking)
	o = <-c
	require.NoError(t, o.err)
	require.Equal(t, 6.0, o.z[0].Score)

	held := newBlockingRead(1)
	d := nextAsync(ctx, w, "h", since, held.read)
	inFlight(t, w, "h")
	cctx, cancel := context.WithCancel(ctx)
	e := nextAsync(cctx, w, "h", since, newBlockingRead(0).read)
	cancel()
	require.True(t, errors.Is((<-e).err, context.Canceled))
	close(held.release)
	require.NoError(t, (<-d).err)
}

// A shared answer that says work is due now may be stale (the work taken
// since, which publishes nothing): the joiners take the answer of a read
// that started after their looks ended instead, one read for them all,
// rather than sleep the poll interval on it. A caller whose look began
// when a read started (not before it) does not join it.
func TestWakerNextDueIsReadAgain(t *testing.T) {
	w := &waker{}
	ctx := context.Background()
	since := time.Now()
	due := newBlockingRead(3) // a score of now or before (see future)
	a := nextAsync(ctx, w, "t", since, due.read)
	r := inFlight(t, w, "t")
	again := newBlockingRead(50)
	b1 := nextAsync(ctx, w, "t", since, again.read)
	b2 := nextAsync(ctx, w, "t", since, again.read)
	awaitJoined(t, w, r, 2)
	same := newBlockingRead(60)
	close(same.release)
	c := nextAsync(ctx, w, "t", r.start, same.read)
	require.Equal(t, 60.0, (<-c).z[0].Score, "its look began when the read started: it reads itself")
	close(due.release)
	require.Equal(t, 3.0, (<-a).z[0].Score, "the starter's own read is its answer")
	r2 := inFlight(t, w, "t")
	awaitJoined(t, w, r2, 1)
	close(again.release)
	require.Equal(t, 50.0, (<-b1).z[0].Score, "work due in the shared answer: a read after its look")
	require.Equal(t, 50.0, (<-b2).z[0].Score)
	require.Equal(t, int32(1), again.calls.Load(), "one read for both joiners")
}
