"""Attacks on gpuwarden, one test each (issue 38): every test drives the real process or the
product function an attacker reaches, and asserts that nothing was drained, uncordoned,
requeued, executed or written outside its folder."""
