package runqueue_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// Example shows the life of a run: enqueue, dequeue under a lease, ack.
func Example() {
	ctx := context.Background()
	mr, err := miniredis.Run() // any Redis will do; miniredis keeps the example self-contained
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	q, err := runqueue.New(ctx, client, nil) // nil: every Config default
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()

	queued, err := q.Enqueue(ctx, runqueue.EnqueueParams{
		Env:     "prod",
		Queue:   "emails",
		Key:     "customer-42", // runs of one key share its concurrency limit
		ID:      "welcome-42",  // enqueueing the same id again is a no-op
		Payload: []byte(`{"to":"ada@example.com"}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("queued:", queued)

	runs, err := q.Dequeue(ctx, "prod", "emails", 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		fmt.Printf("run %s of %s, attempt %d: %s\n", r.ID, r.Key, r.Attempt, r.Payload)
		// ... do the work, then:
		if err := q.Ack(ctx, r); err != nil {
			log.Fatal(err)
		}
	}

	stats, err := q.QueueStats(ctx, "prod", "emails")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready:", stats.Ready, "in flight:", stats.InFlight)
	// Output:
	// queued: true
	// run welcome-42 of customer-42, attempt 1: {"to":"ada@example.com"}
	// ready: 0 in flight: 0
}
