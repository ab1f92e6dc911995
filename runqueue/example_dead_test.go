package runqueue_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// Example_deadLetters follows a run that fails for good: Nack dead-letters
// it once it has no attempts left (Config.MaxAttempts), DeadLetters lists
// it for inspection, and Redrive puts it back, ready now, with its attempts
// reset.
func Example_deadLetters() {
	ctx := context.Background()
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	q, err := runqueue.New(ctx, client, &runqueue.Config{MaxAttempts: 1}) // one delivery, then dead letter
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()

	if _, err := q.Enqueue(ctx, runqueue.EnqueueParams{
		Env: "prod", Queue: "invoices", Key: "customer-7", ID: "invoice-1001", Payload: []byte("bad address"),
	}); err != nil {
		log.Fatal(err)
	}
	runs, err := q.Dequeue(ctx, "prod", "invoices", 1)
	if err != nil {
		log.Fatal(err)
	}
	res, err := q.Nack(ctx, runs[0], nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued:", res.Requeued)

	dead, err := q.DeadLetters(ctx, "prod", "invoices", 0, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dead {
		fmt.Printf("dead: %s of %s after %d attempt(s): %s\n", d.ID, d.Key, d.Attempt-1, d.Payload)
	}

	// The address is fixed: put the run back.
	if err := q.Redrive(ctx, "prod", "invoices", "customer-7", "invoice-1001"); err != nil {
		log.Fatal(err)
	}
	runs, err = q.Dequeue(ctx, "prod", "invoices", 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("redriven: %s, attempt %d\n", runs[0].ID, runs[0].Attempt)
	if err := q.Ack(ctx, runs[0]); err != nil {
		log.Fatal(err)
	}

	stats, err := q.QueueStats(ctx, "prod", "invoices")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead:", stats.Dead)
	// Output:
	// requeued: false
	// dead: invoice-1001 of customer-7 after 1 attempt(s): bad address
	// redriven: invoice-1001, attempt 1
	// dead: 0
}
