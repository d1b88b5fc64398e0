package harness

import (
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	chartColors = []color.Color{
		color.RGBA{R: 31, G: 119, B: 180, A: 255},
		color.RGBA{R: 255, G: 127, B: 14, A: 255},
		color.RGBA{R: 44, G: 160, B: 44, A: 255},
		color.RGBA{R: 214, G: 39, B: 40, A: 255},
		color.RGBA{R: 148, G: 103, B: 189, A: 255},
	}
	faultColor = color.RGBA{R: 120, G: 120, B: 120, A: 255}
)

// WriteChart draws the report as a PNG of 1,200 × 800 points: above, p50
// and p99 latency per second of the main operations on a log scale; below,
// acknowledged state changes per second. Dashed verticals mark the start
// of the steady phase, each find-max step and each fault.
func WriteChart(w io.Writer, rep *Report) error {
	lat, ymin, ymax, err := latencyPlot(rep)
	if err != nil {
		return err
	}
	tput, tmax, err := commitsPlot(rep)
	if err != nil {
		return err
	}
	for _, m := range chartMarks(rep) {
		if err := addMark(lat, m, ymin, ymax); err != nil {
			return err
		}
		if err := addMark(tput, m, 0, tmax); err != nil {
			return err
		}
	}

	img := vgimg.New(vg.Points(1200), vg.Points(800))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(8), PadBottom: vg.Points(8), PadX: vg.Points(8), PadY: vg.Points(16), PadLeft: vg.Points(8), PadRight: vg.Points(16)}
	plots := [][]*plot.Plot{{lat}, {tput}}
	canvases := plot.Align(plots, tiles, dc)
	lat.Draw(canvases[0][0])
	tput.Draw(canvases[1][0])
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// latencyPlot is the chart's upper plot: a solid p99 and a dashed p50
// line per main operation with points, a colour each, each latency at
// least 0.01 ms (the log scale has no zero). ymin is the lowest latency
// drawn (0.01 with none), ymax the highest (1 at least): the marks span
// them.
func latencyPlot(rep *Report) (lat *plot.Plot, ymin, ymax float64, err error) {
	lat = plot.New()
	lat.Title.Text = fmt.Sprintf("%s, %s profile ×%g: latency per second", rep.Target, rep.Profile.Name, rep.Profile.Scale)
	lat.X.Label.Text = "seconds"
	lat.Y.Label.Text = "ms (log)"
	lat.Y.Scale = plot.LogScale{}
	lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lat.Legend.Top = true
	ymin, ymax = math.Inf(1), 1.0
	ci := 0
	for _, op := range []string{OpAcquire, OpAcquireContended, OpRenew, OpRelease, OpReserve} {
		pts := rep.Series[op]
		if len(pts) == 0 {
			continue
		}
		for qi, q := range []string{"p99", "p50"} {
			xy := make(plotter.XYs, len(pts))
			for i, p := range pts {
				v := p.P99MS
				if q == "p50" {
					v = p.P50MS
				}
				v = math.Max(v, 0.01)
				ymin, ymax = math.Min(ymin, v), math.Max(ymax, v)
				xy[i] = plotter.XY{X: float64(p.Second), Y: v}
			}
			l, err := plotter.NewLine(xy)
			if err != nil {
				return nil, 0, 0, err
			}
			l.Color = chartColors[ci%len(chartColors)]
			if qi == 1 {
				l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
			}
			lat.Add(l)
			lat.Legend.Add(op+" "+q, l)
		}
		ci++
	}
	if math.IsInf(ymin, 1) {
		ymin = 0.01
	}
	return lat, ymin, ymax, nil
}

// commitsPlot is the chart's lower plot: the state changes acknowledged
// each second, from second 0 to the last recorded (0 where none were).
// tmax is the most in a second, 1 at least: the marks span it.
func commitsPlot(rep *Report) (tput *plot.Plot, tmax float64, err error) {
	tput = plot.New()
	tput.Title.Text = "acknowledged state changes per second"
	tput.X.Label.Text = "seconds"
	tput.Y.Label.Text = "commits/s"
	perSec := map[int]float64{}
	last := 0
	for _, op := range stateChanges {
		for _, p := range rep.Series[op] {
			perSec[p.Second] += float64(p.Count)
			last = max(last, p.Second)
		}
	}
	xy := make(plotter.XYs, 0, last+1)
	tmax = 1.0
	for s := 0; s <= last; s++ {
		xy = append(xy, plotter.XY{X: float64(s), Y: perSec[s]})
		tmax = math.Max(tmax, perSec[s])
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return nil, 0, err
	}
	l.Color = chartColors[0]
	tput.Add(l)
	return tput, tmax, nil
}

// chartMarks are the events the chart marks, as faults: the start of
// the steady phase, each find-max step after the first (which starts
// with it), and the faults.
func chartMarks(rep *Report) []FaultEvent {
	marks := []FaultEvent{{Kind: "steady", AtS: rep.SteadyFromS}}
	for _, st := range rep.Steps[min(1, len(rep.Steps)):] {
		marks = append(marks, FaultEvent{Kind: fmt.Sprintf("×%.2g", st.Scale), AtS: st.FromS})
	}
	return append(marks, rep.Faults...)
}

// addMark draws mark m on p as a dashed vertical from lo to hi, labelled
// with its kind at the top.
func addMark(p *plot.Plot, m FaultEvent, lo, hi float64) error {
	v, err := plotter.NewLine(plotter.XYs{{X: m.AtS, Y: lo}, {X: m.AtS, Y: hi}})
	if err != nil {
		return err
	}
	v.Color = faultColor
	v.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	p.Add(v)
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: []plotter.XY{{X: m.AtS, Y: hi}}, Labels: []string{" " + m.Kind}})
	if err != nil {
		return err
	}
	p.Add(labels)
	return nil
}
