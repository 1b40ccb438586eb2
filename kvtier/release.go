package kvtier

// releaseLoop is the releaser: it returns freed pages to the OS whenever
// unlock finds a release due, until Close.
func (s *Store) releaseLoop() {
	defer close(s.releaseDone)
	for {
		select {
		case <-s.releaseStop:
			return
		case <-s.releaseKick:
		}
		s.mu.Lock()
		// Pages freed during a punch may make another one due.
		for !s.closed && s.arena.punchDue() {
			s.releasePages()
		}
		s.mu.Unlock()
	}
}

// releasePages returns every free resident page to the OS: it reserves
// them under mu, so that no put is handed a page being punched, punches
// them without mu, so that reads and puts proceed meanwhile, and frees
// them again under mu. mu held; released around the punch.
func (s *Store) releasePages() {
	runs := s.arena.reserveFree()
	var pages int
	s.unlocked(func() {
		if s.punchHook != nil {
			s.punchHook()
		}
		pages = s.arena.punchRuns(runs)
	})
	s.arena.unreserve(runs)
	s.released += uint64(pages) * uint64(s.arena.pageSize)
	s.moved.Broadcast() // puts waiting for the reserved pages
}
