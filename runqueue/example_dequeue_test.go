package runqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/runqueue/runqueue/runqueue"
)

// handle stands for the work a run asks for.
func handle(payload []byte) error {
	if string(payload) == "flaky" {
		return errors.New("upstream timed out")
	}
	return nil
}

// Example_dequeueLoop is a consumer loop without the Worker: wait for runs,
// run each, Ack the ones that worked and Nack the ones that failed, which
// puts them back for a retry after a backoff.
func Example_dequeueLoop() {
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

	// Runs of one key are served oldest first; runs enqueued within the
	// same millisecond, by id.
	for i, p := range []string{"ok", "flaky"} {
		if _, err := q.Enqueue(ctx, runqueue.EnqueueParams{
			Env: "org-42", Queue: "builds", Key: "repo-7", ID: fmt.Sprintf("build-%d", i+1), Payload: []byte(p),
		}); err != nil {
			log.Fatal(err)
		}
	}

	// One pass of the loop; a consumer runs it until it is told to stop.
	runs, err := q.DequeueWait(ctx, "org-42", "builds", 10, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range runs {
		if err := handle(r.Payload); err != nil {
			res, err := q.Nack(ctx, r, nil) // nil: retry after Queue.Backoff
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("%s failed, requeued: %v, next attempt %d\n", r.ID, res.Requeued, res.Attempt)
			continue
		}
		if err := q.Ack(ctx, r); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s done\n", r.ID)
	}

	stats, err := q.QueueStats(ctx, "org-42", "builds")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready:", stats.Ready, "delayed:", stats.Delayed, "in flight:", stats.InFlight)
	// Output:
	// build-1 done
	// build-2 failed, requeued: true, next attempt 2
	// ready: 0 delayed: 1 in flight: 0
}
