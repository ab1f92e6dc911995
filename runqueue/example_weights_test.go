package runqueue_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// Example_weights gives one concurrency key three times the share of
// another with SetWeight, dequeues with the fair scheduler on, and reads
// the scheduler's view of the queue with Schedule.
func Example_weights() {
	ctx := context.Background()
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	q, err := runqueue.New(ctx, client, &runqueue.Config{VtimeScheduling: true})
	if err != nil {
		log.Fatal(err)
	}
	defer q.Close()

	// A weight applies at the next serve, on every instance; it is
	// configuration and does not expire with the scheduler's state.
	if err := q.SetWeight(ctx, "prod", "reports", "gold", 3); err != nil {
		log.Fatal(err)
	}
	for _, key := range []string{"basic", "gold"} {
		for i := range 6 {
			if _, err := q.Enqueue(ctx, runqueue.EnqueueParams{
				Env: "prod", Queue: "reports", Key: key, ID: fmt.Sprintf("%s-%d", key, i),
			}); err != nil {
				log.Fatal(err)
			}
		}
	}

	runs, err := q.Dequeue(ctx, "prod", "reports", 8)
	if err != nil {
		log.Fatal(err)
	}
	served := map[string]int{}
	for _, r := range runs {
		served[r.Key]++
	}
	fmt.Println("served: gold", served["gold"], "basic", served["basic"])

	sched, err := q.Schedule(ctx, "prod", "reports", 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, k := range sched.Keys {
		reason := k.Reason // why the key is not served now; "" while it competes
		if reason == "" {
			reason = "competing"
		}
		fmt.Printf("%-5s weight %g, ready %d, in flight %d: %s\n", k.Key, k.Weight, k.Ready, k.InFlight, reason)
	}
	// Output:
	// served: gold 6 basic 2
	// basic weight 1, ready 4, in flight 2: competing
	// gold  weight 3, ready 0, in flight 6: idle
}
