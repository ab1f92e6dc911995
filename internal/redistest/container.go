package redistest

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// containerImage is the image of the Redis that testcontainers starts, the
// same major.minor as the redis-server CI installs.
const containerImage = "redis:7.0"

// dockerTimeout bounds the check that a Docker engine answers.
const dockerTimeout = 3 * time.Second

// dockerEngine returns nil when a Docker engine answers within dockerTimeout,
// at the host testcontainers finds: ~/.testcontainers.properties, DOCKER_HOST,
// the Docker context, /var/run/docker.sock or a rootless socket.
func dockerEngine() error {
	ctx, cancel := context.WithTimeout(context.Background(), dockerTimeout)
	defer cancel()
	// Finding the host checks that it answers docker info, under ctx; the
	// outcome is cached, so the provider that Run creates later, without a
	// deadline, cannot hang on an engine that does not answer.
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	return cli.Close()
}

// startContainer starts a Redis container with testcontainers-go's Redis
// module. chooseReal has checked that a Docker engine answers.
func startContainer() (*deployment, error) {
	// The first run on a machine pulls the image.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := tcredis.Run(ctx, containerImage)
	stop := func() { _ = testcontainers.TerminateContainer(c) }
	if err != nil {
		stop()
		return nil, fmt.Errorf("testcontainers %s: %w", containerImage, err)
	}
	url, err := c.ConnectionString(ctx)
	if err != nil {
		stop()
		return nil, fmt.Errorf("testcontainers %s: %w", containerImage, err)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		stop()
		return nil, fmt.Errorf("testcontainers %s: %q: %w", containerImage, url, err)
	}
	rc := redis.NewClient(opt)
	defer func() { _ = rc.Close() }()
	info, err := rc.Info(ctx, "server").Result()
	if err != nil {
		stop()
		return nil, fmt.Errorf("testcontainers %s: INFO server: %w", containerImage, err)
	}
	return &deployment{
		addrs:  []string{opt.Addr},
		opt:    opt,
		source: fmt.Sprintf("%s: %s, redis %s at %s", originContainer, containerImage, infoField(info, "redis_version"), opt.Addr),
		stop:   stop,
	}, nil
}
