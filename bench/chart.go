package main

import (
	"bytes"
	"image/color"
	"math"
	"slices"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/runqueue/runqueue/internal/scenario"
)

func init() {
	// Sans-serif reads better at chart sizes; the SVG names the font and a
	// viewer without Liberation falls back to its own sans-serif.
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
}

// cumulativeSpec says which keys of a scenario a chart draws.
type cumulativeSpec struct {
	title string
	keys  []string
}

// scenarioCharts are the scenarios drawn as cumulative serves per key,
// flag off beside flag on.
var scenarioCharts = map[string]cumulativeSpec{
	"skew":    {title: "skew: cumulative serves per key (heavy key with 120 runs, 4 light keys with 10 arriving later)", keys: []string{"heavy", "light00", "light01", "light02", "light03"}},
	"weights": {title: "weights: cumulative serves per key (a weight 1, b weight 3; 300 runs each)", keys: []string{"a", "b"}},
}

// maxPoints bounds the points of one line so the SVG stays small.
const maxPoints = 160

var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // heavy / first key: red
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// downsample keeps at most maxPoints of series (always its first and last
// point): cumulative counts are monotone, so the shape survives.
func downsample(series []int) plotter.XYs {
	n := len(series)
	if n == 0 {
		return nil
	}
	stride := max(1, (n+maxPoints-1)/maxPoints)
	var xy plotter.XYs
	for i := 0; i < n; i += stride {
		xy = append(xy, plotter.XY{X: float64(i), Y: float64(series[i])})
	}
	if last := n - 1; xy[len(xy)-1].X != float64(last) {
		xy = append(xy, plotter.XY{X: float64(last), Y: float64(series[last])})
	}
	return xy
}

// cumulativeChart draws two panels, flag off and flag on, of the
// cumulative serves of spec.keys over steps, on the same axes.
func cumulativeChart(spec cumulativeSpec, off, on *scenario.Result) ([]byte, error) {
	// Draw up to the last serve of either arm: a scenario may run idle
	// steps after its last serve.
	steps := max(off.DrainSteps, on.DrainSteps) + 1
	ymax := 0.0
	panels := make([]*plot.Plot, 2)
	for i, r := range []*scenario.Result{off, on} {
		p := plot.New()
		p.Title.Text = "flag " + flagName(i == 1)
		if i == 1 {
			p.Title.Text += " (fair virtual-time order)"
		} else {
			p.Title.Text += " (age order)"
		}
		p.X.Label.Text = "step (dequeue call)"
		p.Y.Label.Text = "runs served"
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.TextStyle.Font.Size = vg.Points(9)
		p.X.Tick.Marker = intTicks{}
		p.Add(plotter.NewGrid())
		cum := r.CumulativeServes()
		for k, key := range spec.keys {
			series := make([]int, steps) // never served: a flat line at 0
			copy(series, cum[key])
			for j := min(len(cum[key]), steps); j > 0 && j < steps; j++ {
				series[j] = series[j-1] // the arm drained earlier: hold its total
			}
			l, err := plotter.NewLine(downsample(series))
			if err != nil {
				return nil, err
			}
			l.Color = palette[k%len(palette)]
			// The first key (heavy, a) is a wide solid line under dashed
			// others, so that a line hidden under another still shows.
			l.Width = vg.Points(2.5)
			if k > 0 {
				l.Width = vg.Points(1.5)
				l.Dashes = []vg.Length{vg.Points(6), vg.Points(2 + float64(k))}
			}
			p.Add(l)
			p.Legend.Add(key, l)
			ymax = math.Max(ymax, float64(slices.Max(append(series, 0))))
		}
		panels[i] = p
	}
	for _, p := range panels {
		p.X.Min, p.X.Max = 0, float64(max(1, steps-1))
		p.Y.Min, p.Y.Max = 0, math.Max(1, ymax*1.05)
	}
	return tiles(panels, spec.title, 11*vg.Centimeter)
}

// tiles lays plots side by side under a title and renders them as SVG.
func tiles(plots []*plot.Plot, title string, panelWidth vg.Length) ([]byte, error) {
	w, h := vg.Length(len(plots))*panelWidth, 9*vg.Centimeter
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	top := vg.Length(0)
	if title != "" {
		sty := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 11), XAlign: draw.XCenter, YAlign: draw.YTop,
			Handler: plot.DefaultTextHandler}
		dc.FillText(sty, vg.Point{X: w / 2, Y: h - vg.Points(4)}, title)
		top = sty.Height(title) + vg.Points(12)
	}
	t := draw.Tiles{Rows: 1, Cols: len(plots), PadTop: top, PadX: vg.Centimeter, PadLeft: vg.Points(4), PadRight: vg.Points(8), PadBottom: vg.Points(4)}
	canvases := plot.Align([][]*plot.Plot{plots}, t, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sweepChart draws Redis µs per run lifecycle and per dequeue against the
// active keys (log x), flag off and on.
func sweepChart(rows []SweepRow) ([]byte, error) {
	p := plot.New()
	p.Title.Text = "Redis CPU per run against active keys"
	p.X.Label.Text = "active concurrency keys (log scale)"
	p.Y.Label.Text = "Redis µs per run"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	// Bottom left: the lines stay well above 0.
	p.Legend.Top, p.Legend.Left = false, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(6), vg.Points(4)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	type line struct {
		name  string
		flag  string
		get   func(SweepRow) float64
		color int
		dash  bool
	}
	lines := []line{
		{"lifecycle, flag off", "off", func(r SweepRow) float64 { return r.RedisUsPerRun }, 1, false},
		{"lifecycle, flag on", "on", func(r SweepRow) float64 { return r.RedisUsPerRun }, 0, false},
		{"dequeue only, flag off", "off", func(r SweepRow) float64 { return r.DequeueUsPerRun }, 1, true},
		{"dequeue only, flag on", "on", func(r SweepRow) float64 { return r.DequeueUsPerRun }, 0, true},
	}
	ymax := 0.0
	for _, ln := range lines {
		var xy plotter.XYs
		for _, r := range rows {
			if r.Flag == ln.flag {
				xy = append(xy, plotter.XY{X: float64(r.Keys), Y: ln.get(r)})
				ymax = math.Max(ymax, ln.get(r))
			}
		}
		sort.Slice(xy, func(i, j int) bool { return xy[i].X < xy[j].X })
		if len(xy) == 0 {
			continue
		}
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		l.Color, s.Color = palette[ln.color], palette[ln.color]
		l.Width = vg.Points(1.5)
		if ln.dash {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l, s)
		p.Legend.Add(ln.name, l, s)
	}
	p.Y.Min, p.Y.Max = 0, math.Max(1, ymax*1.15)
	return tiles([]*plot.Plot{p}, "", 16*vg.Centimeter)
}

// intTicks are plot.DefaultTicks labelled without trailing zeros ("25",
// not "25.00").
type intTicks struct{}

func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ts {
		if t.Label != "" {
			ts[i].Label = strconv.FormatFloat(t.Value, 'f', -1, 64)
		}
	}
	return ts
}
