package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Metrics is one scrape of a node's /metrics: each series (name with its
// labels, as exposed) to its value.
type Metrics map[string]float64

// Scrape reads the Prometheus text exposition at http://httpAddr/metrics
// (10 s at most).
func Scrape(ctx context.Context, httpAddr string) (Metrics, error) {
	return ScrapeWith(ctx, http.DefaultClient, httpAddr)
}

// ScrapeWith is Scrape through c, for a caller that bounds its requests or
// closes its idle connections itself.
func ScrapeWith(ctx context.Context, c *http.Client, httpAddr string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %s", httpAddr, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	m := Metrics{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, nil
}
