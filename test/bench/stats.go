package main

import (
	"crypto/sha256"
	"math"
	"slices"
	"time"
)

// RunStats summarises one repetition of one measured case.
type RunStats struct {
	N          int           // samples
	P50        time.Duration // median latency
	P99        time.Duration // 99th percentile latency
	Throughput float64       // operations per second over the run's wall time
}

// summarise computes a RunStats from latency samples and the wall time
// the samples took together (with concurrency, wall < sum of samples).
func summarise(samples []time.Duration, wall time.Duration) RunStats {
	rs := RunStats{N: len(samples)}
	if len(samples) == 0 {
		return rs
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rs.P50 = percentile(s, 50)
	rs.P99 = percentile(s, 99)
	if wall > 0 {
		rs.Throughput = float64(len(samples)) / wall.Seconds()
	}
	return rs
}

// percentile returns the nearest-rank percentile of sorted samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// median of float64s (mean of the two middle values for an even count).
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func medianDur(v []time.Duration) time.Duration {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = float64(d)
	}
	m := median(f)
	if math.IsNaN(m) {
		return 0
	}
	return time.Duration(m)
}

// meanStd returns the mean and sample standard deviation.
func meanStd(v []float64) (float64, float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	mean := sum / float64(len(v))
	if len(v) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(v)-1))
}

// Calibration is a fixed CPU-bound loop run several times: its coefficient
// of variation says how steady the CPU was.
type Calibration struct {
	Rounds []time.Duration
	Mean   time.Duration
	CV     float64 // stddev / mean
}

// calibrationWork hashes a 64 KiB buffer 2000 times (about 70 ms on this
// class of server core); the work never changes between runs.
func calibrationWork() {
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte(i)
	}
	var sum [32]byte
	for i := 0; i < 2000; i++ {
		sum = sha256.Sum256(buf)
		buf[0] = sum[0] // each round depends on the last: nothing to optimise away
	}
}

func calibrate(rounds int) Calibration {
	calibrationWork() // warm caches and the frequency governor
	c := Calibration{}
	f := make([]float64, 0, rounds)
	for i := 0; i < rounds; i++ {
		t0 := time.Now()
		calibrationWork()
		d := time.Since(t0)
		c.Rounds = append(c.Rounds, d)
		f = append(f, float64(d))
	}
	mean, std := meanStd(f)
	c.Mean = time.Duration(mean)
	if mean > 0 {
		c.CV = std / mean
	}
	return c
}

// addSamples adds one run of sequential samples to m.
func addSamples(m *Measure, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	m.add(summarise(samples, sum))
}
