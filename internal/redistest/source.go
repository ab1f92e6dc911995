package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// origin is where a test binary's real Redis comes from.
type origin int

const (
	originNone      origin = iota
	originURL              // REDIS_URL: a server someone else runs
	originAddrs            // REDIS_CLUSTER_ADDRS: cluster nodes someone else runs
	originSpawned          // a redis-server from PATH, started by the test binary
	originContainer        // testcontainers-go's Redis module, on a Docker engine
)

// String is the word that starts every Source and ClusterSource.
func (o origin) String() string {
	switch o {
	case originURL:
		return "REDIS_URL"
	case originAddrs:
		return "REDIS_CLUSTER_ADDRS"
	case originSpawned:
		return "spawned"
	case originContainer:
		return "testcontainers"
	}
	return "none"
}

// chooseReal decides where Real's Redis comes from, taking the first of:
// the server at url (REDIS_URL), a redis-server that lookPath finds (its
// path is returned), a container when docker reports an engine. It asks
// lookPath and docker only when everything before them is missing, so a run
// with REDIS_URL or a binary never waits on a Docker probe. With none, the
// error wraps errMissing and says why each one is missing.
func chooseReal(url string, lookPath func(string) (string, error), docker func() error) (origin, string, error) {
	if url != "" {
		return originURL, "", nil
	}
	bin, err := lookPath("redis-server")
	if err == nil {
		return originSpawned, bin, nil
	}
	derr := docker()
	if derr == nil {
		return originContainer, "", nil
	}
	return originNone, "", fmt.Errorf("no REDIS_URL, %w (%v), and no Docker engine for testcontainers (%v)", errMissing, err, derr)
}

// chooseCluster is chooseReal for Cluster: the nodes in addrs
// (REDIS_CLUSTER_ADDRS, comma-separated), or else redis-servers from PATH.
// There is no container fallback: a cluster in containers announces
// addresses that the host cannot always reach.
func chooseCluster(addrs string, lookPath func(string) (string, error)) (origin, string, error) {
	if addrs != "" {
		return originAddrs, "", nil
	}
	bin, err := lookPath("redis-server")
	if err == nil {
		return originSpawned, bin, nil
	}
	return originNone, "", fmt.Errorf("no REDIS_CLUSTER_ADDRS and %w (%v)", errMissing, err)
}

// startReal starts, or finds, the Redis that Real shares.
func startReal() (*deployment, error) {
	url := os.Getenv("REDIS_URL")
	o, bin, err := chooseReal(url, exec.LookPath, dockerEngine)
	switch o {
	case originURL:
		return urlDeployment(url)
	case originSpawned:
		return startSpawned(bin)
	case originContainer:
		return startContainer()
	}
	return nil, err
}

// startClustered starts, or finds, the Redis Cluster that Cluster shares.
func startClustered() (*deployment, error) {
	addrs := os.Getenv("REDIS_CLUSTER_ADDRS")
	o, bin, err := chooseCluster(addrs, exec.LookPath)
	switch o {
	case originAddrs:
		return &deployment{
			addrs:  strings.Split(addrs, ","),
			source: fmt.Sprintf("%s: %s", originAddrs, addrs),
			stop:   func() {},
		}, nil
	case originSpawned:
		return startCluster(bin)
	}
	return nil, err
}
