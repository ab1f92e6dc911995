package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// ExampleWorker runs a handler over a queue: a run whose handler returns
// nil is acked, one that fails for good is dead-lettered.
func ExampleWorker() {
	ctx := context.Background()
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	q, err := runqueue.New(ctx, client, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()

	for _, to := range []string{"ada", "grace", "nobody"} {
		if _, err := q.Enqueue(ctx, runqueue.EnqueueParams{
			Env: "prod", Queue: "emails", Key: "customer-42", ID: "welcome-" + to, Payload: []byte(to),
		}); err != nil {
			log.Fatal(err)
		}
	}

	var mu sync.Mutex
	var sent []string
	var handled sync.WaitGroup
	handled.Add(3)
	w, err := runqueue.NewWorker(q, func(ctx context.Context, r *runqueue.Run) error {
		defer handled.Done()
		if string(r.Payload) == "nobody" {
			return runqueue.NoRetry(errors.New("no such address")) // dead-letter it
		}
		mu.Lock()
		sent = append(sent, string(r.Payload))
		mu.Unlock()
		return nil // ack it
	}, &runqueue.WorkerConfig{
		Queues:      []runqueue.WorkerQueue{{Env: "prod", Queue: "emails"}},
		Concurrency: 2,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	handled.Wait() // in a service: wait for a signal instead

	// Shutdown stops fetching, waits for running handlers (here up to 30s)
	// and sends the last acks; runs still running then are released to be
	// redelivered at once.
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := w.Shutdown(stop); err != nil {
		log.Fatal(err)
	}

	slices.Sort(sent)
	fmt.Println("sent:", sent)
	stats, err := q.QueueStats(ctx, "prod", "emails")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready:", stats.Ready, "in flight:", stats.InFlight, "dead:", stats.Dead)
	// Output:
	// sent: [ada grace]
	// ready: 0 in flight: 0 dead: 1
}
