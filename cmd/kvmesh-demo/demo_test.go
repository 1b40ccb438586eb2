package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSummaryMatchesTables runs a small demo on the trained model and
// checks that every claim of the closing summary is what the tables above
// it print: the speedups at the largest k, the answers kept and right, the
// compute, and the count of cells where APPROXIMATE reuse is faster. It
// checks no timing itself, only that the summary and the tables agree; and
// that r=100% recompute is bit-identical to prefill on every prompt.
func TestSummaryMatchesTables(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node cluster and the trained model")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	args := []string{"-model", "../../train/recall", "-facts", "200", "-k", "5,50", "-queries", "2", "-answer-prompts", "1", "-out", t.TempDir(),
		"-serve-users", "1,4", "-serve-warm", "50ms", "-serve-duration", "200ms", "-serve-generate", "3",
		"-shape-hidden", "1024", "-shape-layers", "1", "-shape-k", "5,10", "-shape-queries", "1"}
	if err := demo(ctx, args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Log(text)
	block := func(header string) [][]string {
		i := strings.Index(text, header)
		if i < 0 {
			t.Fatalf("no table %q in the output", header)
		}
		lines := strings.Split(text[i:], "\n")
		// Skip the header's own lines up to the column names.
		for len(lines) > 0 && !strings.HasSuffix(strings.TrimSpace(lines[0]), ":") {
			lines = lines[1:]
		}
		var rows [][]string
		for _, l := range lines[2:] {
			if strings.TrimSpace(l) == "" {
				break
			}
			rows = append(rows, strings.Fields(l))
		}
		return rows
	}
	summary := func(re string) []string {
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no summary line matching %q", re)
		}
		return m[1:]
	}
	atoi := func(s string) int {
		n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return n
	}
	ms := func(s string) float64 {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return f
	}

	ttft := block("TTFT over")
	last := ttft[len(ttft)-1]
	got := summary(`- TTFT at k=(\d+) \(\d+-token prompts, p50\): KV injection ([\d.]+x) faster than prompt injection from a local hit, ([\d.]+x) from a remote hit`)
	if got[0] != last[0] || got[1] != last[8] || got[2] != last[9] {
		t.Errorf("summary says k=%s local %s remote %s; the TTFT table's last row is %v", got[0], got[1], got[2], last)
	}

	totals := map[string][]string{}
	for _, r := range block("every way over the") {
		name := strings.Join(r[:len(r)-6], " ")
		totals[name] = r[len(r)-6:]
	}
	exact, approx, prompt := totals["KV EXACT"], totals["APPROX after system prompt, r=15%"], totals["prompt injection"]
	if exact == nil || approx == nil || prompt == nil {
		t.Fatalf("totals table lacks a way: %v", totals)
	}
	got = summary(`- answers kept on (\d+) held-out prompts: KV EXACT (\d+) of (\d+) the same as prompt injection's, APPROX after system prompt, r=15% (\d+) of (\d+) \(([^)]*)\); right: (\d+), (\d+) and (\d+) of (\d+)\.`)
	perTask := got[5]
	got = append(got[:5], got[6:]...)
	n := got[0]
	for _, c := range [][2]string{
		{got[1] + "/" + got[2], exact[2]}, {got[3] + "/" + got[4], approx[2]},
		{got[5] + "/" + got[8], prompt[0]}, {got[6] + "/" + got[8], exact[0]}, {got[7] + "/" + got[8], approx[0]},
		{n + "/" + n, exact[2]},
	} {
		if c[0] != c[1] {
			t.Errorf("summary says %s, the totals table %s", c[0], c[1])
		}
	}

	got = summary(`- compute saved: APPROX after system prompt, r=15% computes (\d+)% of full prefill's token-layers \((\d+)% saved\), its TTFT below prompt injection's in (\d+) of (\d+) cells with k >= 20; KV EXACT computes (\d+)%`)
	if got[0]+"%" != approx[4] || got[4]+"%" != exact[4] {
		t.Errorf("summary says computed %s%% and %s%%; the totals table %s and %s", got[0], got[4], approx[4], exact[4])
	}
	if sum := atoi(got[0]) + atoi(got[1]); sum < 99 || sum > 101 { // each rounded
		t.Errorf("computed %s%% and saved %s%% do not add up", got[0], got[1])
	}
	faster, cells := 0, 0
	same, prompts := map[string]int{}, map[string]int{}
	var tasks []string
	for _, r := range block("answers on held-out prompts") {
		if same[r[0]] == 0 && prompts[r[0]] == 0 {
			tasks = append(tasks, r[0])
		}
		same[r[0]] += atoi(r[10])
		prompts[r[0]] += atoi(strings.Split(r[9], "/")[1])
		if atoi(r[1]) < 20 {
			continue
		}
		cells++
		if ms(r[11]) < ms(r[4]) {
			faster++
		}
	}
	if atoi(got[2]) != faster || atoi(got[3]) != cells {
		t.Errorf("summary says faster in %s of %s cells; the answers table shows %d of %d", got[2], got[3], faster, cells)
	}

	var per []string
	for _, task := range tasks {
		per = append(per, task+" "+strconv.Itoa(same[task])+"/"+strconv.Itoa(prompts[task]))
	}
	if want := strings.Join(per, ", "); perTask != want {
		t.Errorf("summary says %q per task; the answers table sums to %q", perTask, want)
	}

	if !strings.Contains(text, "concurrent serving") || !strings.Contains(text, "TTFT growth k=5->10 with KV injection") {
		t.Error("the serving table or the realistic shape's growth is missing")
	}
	if !strings.Contains(text, "split by the node's stage timers") {
		t.Error("the realistic shape's per-stage split is missing")
	}

	full := 0
	for _, r := range block("fidelity to full prefill") {
		if r[len(r)-6] != "100%" {
			continue
		}
		full++
		id := strings.Split(r[len(r)-2], "/")
		if id[0] != id[1] || id[0] == "0" {
			t.Errorf("r=100%% is not identical to prefill on every prompt: %v", r)
		}
	}
	if full != 3 {
		t.Errorf("fidelity table has %d rows at r=100%%, want one per approximate encoding", full)
	}
}
