package runqueue

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/runqueue/runqueue/internal/redistest"
)

// A harness script: sched_register_many(S, vms) against
// sched_register(S, vm, false) for each vm in turn, on copies of one
// state, then sched_save. ARGV: mode ("many"/"one"), pre (1: the state is
// read whole first, as a hook before the registrations would), now, ttl,
// idle_max, then the vms.
const regManyHarnessBody = `
local S = sched_open(KEYS[1], KEYS[2], KEYS[3], ARGV[4], ARGV[5], ARGV[3] + 0)
S.check = true
local vms = {}
for i = 6, #ARGV do vms[#vms + 1] = ARGV[i] end
if ARGV[2] == '1' then sched_state(S) end
if ARGV[2] == '2' then sched_drained(S, vms[#vms]); table.remove(vms) end
if ARGV[2] == '3' then sched_released(S, { vms[#vms] }); table.remove(vms) end
if ARGV[1] == 'many' then
  sched_register_many(S, vms)
else
  for _, vm in ipairs(vms) do sched_register(S, vm, false) end
end
sched_save(S)
local st = S.st or {}
return { tostring(st.s), tostring(st.lh), tostring(st.nw), tostring(S.fresh) }
`

func regManyHarness(t testing.TB) string {
	var b strings.Builder
	raw := "--@include record\n--@include sched\n" + regManyHarnessBody
	_, err := expand(&b, "regmany", []byte(raw), true, 0, "")
	require.NoError(t, err)
	src, err := inlineConsts(b.String())
	require.NoError(t, err)
	return src
}

const (
	regManyG = 4503599627370496
	regManyW = 2251799813685248
)

func regManyCode(n int64) string { return fmt.Sprintf("%015d", n) }

type regManyState struct {
	hash    map[string]string // nil: missing
	zset    []redis.Z         // nil: missing
	weights map[string]string
	vms     []string
	pre     int
}

func regManyGen(r *rand.Rand) regManyState {
	V := []int64{0, 3_000_000, 1_000_000_000}[r.Intn(3)]
	s := []int64{1, 2, 60 + r.Int63n(8), 64, 124 + r.Int63n(8), 128, 1 + r.Int63n(300)}[r.Intn(7)]
	h := map[string]string{"v": strconv.FormatInt(V, 10), "e": "0", "c": "0", "x": "9999999999999",
		"gk": "0", "gn": "1", "gp": "0", "ng": "0", "lh": ""}
	z := []redis.Z{{Score: 0, Member: ""}}
	weights := map[string]string{}
	nextSeq := int64(1)
	seq := func() int64 {
		// codes below s, unique
		nextSeq++
		return nextSeq
	}
	pool := []string{"=a", "=b", "=c", "=d", "=e", "=f", "=g", "=h"}
	tag := func() int64 {
		d := []int64{-2_000_000, -1, 0, 1, 500_000, 1_000_000, 3_000_000}[r.Intn(7)]
		x := V + d
		if x < 0 {
			x = 0
		}
		return x
	}
	// filler registrations (competing) to move ZCARD around 64
	nfill := []int{0, 0, 5, 45 + r.Intn(20), 50 + r.Intn(12)}[r.Intn(5)]
	all := append([]string{}, pool...)
	for i := 0; i < nfill; i++ {
		all = append(all, fmt.Sprintf("=f%03d", i))
	}
	var lane []string
	for i, vm := range all {
		kind := r.Intn(6)
		if i >= len(pool) {
			kind = 0
		}
		switch kind {
		case 0: // registered competing
			c := regManyCode(seq())
			h[vm] = c
			z = append(z, redis.Z{Score: float64(tag()), Member: c + vm})
		case 1: // registered waiting in the lane
			sq := seq()
			h[vm] = regManyCode(sq) + "w"
			z = append(z, redis.Z{Score: float64(sq - regManyW), Member: vm})
			lane = append(lane, vm)
		case 2: // parked (tag above or at/below V)
			z = append(z, redis.Z{Score: float64(tag() - regManyG), Member: vm})
		case 3: // gated
			sq := seq()
			u := tag()
			h[vm] = regManyCode(sq) + "g" + strconv.FormatInt(u, 10)
			z = append(z, redis.Z{Score: float64(regManyG + sq), Member: regManyCode(sq) + vm})
			h["ng"] = "1"
		default: // nothing
		}
	}
	if len(lane) > 0 {
		head := lane[0]
		h["lh"] = head
		// the head has a tag too
		c := h[head][:15]
		z = append(z, redis.Z{Score: float64(V + 1_000_000), Member: c + head})
	} else if r.Intn(3) == 0 {
		// a tag above V: a newcomer would become the lane's head
		c := regManyCode(seq())
		h["=top"] = c
		z = append(z, redis.Z{Score: float64(V + 2_000_000), Member: c + "=top"})
	}
	if nextSeq >= s {
		s = nextSeq + 1 + (64*8-nextSeq-1)%64 - int64(r.Intn(9))
		if s <= nextSeq {
			s = nextSeq + 1
		}
	}
	h["s"] = strconv.FormatInt(s, 10)
	switch r.Intn(3) {
	case 0: // nw unknown
	case 1:
		h["nw"] = "0"
	case 2:
		n := 0
		for _, vm := range pool {
			if r.Intn(2) == 0 {
				weights[vm] = []string{"2", "0.5", "7", "1"}[r.Intn(4)]
				n++
			}
		}
		h["nw"] = strconv.Itoa(n)
	}
	if r.Intn(4) == 0 {
		z = append(z, redis.Z{Score: regManyW, Member: "runqueue scheduler: this member is longer than 64 bytes, see lib/sched"})
	}
	st := regManyState{hash: h, zset: z, weights: weights, pre: []int{0, 0, 1, 2, 3}[r.Intn(5)]}
	switch r.Intn(10) {
	case 0: // hash gone, ckVtime stays (stray)
		st.hash = nil
	case 1: // ckVtime gone, hash stays (broken)
		st.zset = nil
	case 2: // sentinel gone only (broken)
		st.zset = st.zset[1:]
	case 3:
		st.hash, st.zset = nil, nil
	}
	n := 2 + r.Intn(9)
	if st.pre >= 2 {
		n++
	}

	cands := append(append([]string{}, pool...), "=n1", "=n2", "=n3", "=top")
	if os.Getenv("REGMANY_BIG") != "" {
		n = 50 + r.Intn(300)
		if x, _ := strconv.Atoi(os.Getenv("REGMANY_N")); x > 0 {
			n = x
		}
		for i := 0; i < 1200; i++ {
			vm := fmt.Sprintf("=p%04d", i)
			cands = append(cands, vm)
			if r.Intn(2) == 0 && st.zset != nil {
				st.zset = append(st.zset, redis.Z{Score: float64(tag() - regManyG), Member: vm})
			}
		}
	}
	for i := 0; i < n; i++ {
		st.vms = append(st.vms, cands[r.Intn(len(cands))])
	}
	return st
}

func regManyLoad(ctx context.Context, t testing.TB, c redis.UniversalClient, k [3]string, st regManyState) {
	require.NoError(t, c.Del(ctx, k[0], k[1], k[2]).Err())
	if st.zset != nil {
		require.NoError(t, c.ZAdd(ctx, k[0], st.zset...).Err())
		require.NoError(t, c.PExpire(ctx, k[0], 3_600_000_000).Err())
	}
	if st.hash != nil {
		require.NoError(t, c.HSet(ctx, k[1], st.hash).Err())
		require.NoError(t, c.PExpire(ctx, k[1], 3_600_000_000).Err())
	}
	if len(st.weights) > 0 {
		require.NoError(t, c.HSet(ctx, k[2], st.weights).Err())
	}
}

func regManyDump(ctx context.Context, t testing.TB, c redis.UniversalClient, k [3]string, real bool) string {
	var b strings.Builder
	zs, err := c.ZRangeWithScores(ctx, k[0], 0, -1).Result()
	require.NoError(t, err)
	for _, z := range zs {
		fmt.Fprintf(&b, "Z %s %.0f\n", z.Member, z.Score)
	}
	hs, err := c.HGetAll(ctx, k[1]).Result()
	require.NoError(t, err)
	var fs []string
	for f, v := range hs {
		fs = append(fs, "H "+f+"="+v)
	}
	sort.Strings(fs)
	b.WriteString(strings.Join(fs, "\n"))
	for _, key := range k[:2] {
		p, _ := c.PTTL(ctx, key).Result()
		fmt.Fprintf(&b, "\nPTTL %v", p > 0)
		if real {
			enc, _ := c.ObjectEncoding(ctx, key).Result()
			fmt.Fprintf(&b, " enc %s", enc)
		}
	}
	return b.String()
}

// TestRegisterManyMatchesOneAtATime: sched_register_many (lib/sched) must
// leave what sched_register leaves called for each variant in turn (then
// sched_save): the same ckVtime and state hash, to their entries, scores,
// lifetimes and, on a real Redis, encodings, and the same scalars. Random
// states (regenerated from the seed): registered, waiting, gated and
// parked variants, a lane head or a tag above V, weights, ckVtime around
// 64 entries with the registration number near a multiple of 64, the
// wide mark; the state hash or ckVtime or the sentinel missing; the state
// read before, or a drain or release first; duplicates. REGMANY_ITERS sets
// the states tried (1,000), REGMANY_BIG=1 draws 50-350 variants a call
// (REGMANY_N a fixed count: 999, 1000, 1001 cross the one-at-a-time
// fallback), and REGMANY_MUTATE="old=>new" edits the harness script
// (a mutation that must make the test fail).
func TestRegisterManyMatchesOneAtATime(t *testing.T) {
	t.Parallel() // only its own prefix on the shared servers, and no wall-clock bound
	src := regManyHarness(t)
	if m := os.Getenv("REGMANY_MUTATE"); m != "" {
		parts := strings.SplitN(m, "=>", 2)
		require.Contains(t, src, parts[0])
		src = strings.Replace(src, parts[0], parts[1], 1)
	}
	iters := 1000
	if s := os.Getenv("REGMANY_ITERS"); s != "" {
		iters, _ = strconv.Atoi(s)
	}
	for _, be := range []struct {
		name string
		c    func(testing.TB) redis.UniversalClient
		real bool
	}{{"Real", redistest.Real, true}, {"Mini", redistest.Mini, false}} {
		t.Run(be.name, func(t *testing.T) {
			c := be.c(t)
			ctx := context.Background()
			p := redistest.Prefix(t)
			ka := [3]string{p + "{q}a:z", p + "{q}a:h", p + "{q}a:w"}
			kb := [3]string{p + "{q}b:z", p + "{q}b:h", p + "{q}b:w"}
			fails := 0
			for seed := 0; seed < iters && fails < 5; seed++ {
				r := rand.New(rand.NewSource(int64(seed)))
				st := regManyGen(r)
				regManyLoad(ctx, t, c, ka, st)
				regManyLoad(ctx, t, c, kb, st)
				before := regManyDump(ctx, t, c, ka, be.real)
				args := func(mode string) []any {
					pre := strconv.Itoa(st.pre)
					a := []any{mode, pre, "1000000", "86400000", "100"}
					for _, vm := range st.vms {
						a = append(a, vm)
					}
					return a
				}
				ra, ea := c.Eval(ctx, src, ka[:], args("one")...).Result()
				rb, eb := c.Eval(ctx, src, kb[:], args("many")...).Result()
				da, db := regManyDump(ctx, t, c, ka, be.real), regManyDump(ctx, t, c, kb, be.real)
				if fmt.Sprint(ea) != fmt.Sprint(eb) || fmt.Sprint(ra) != fmt.Sprint(rb) || da != db {
					fails++
					t.Errorf("seed %d pre=%v vms=%v\nerr one=%v many=%v\nret one=%v many=%v\nbefore:\n%s\n--- one:\n%s\n--- many:\n%s",
						seed, st.pre, st.vms, ea, eb, ra, rb, before, da, db)
				}
			}
		})
	}
}
