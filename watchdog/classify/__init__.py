"""Pure classification of GPU samples into states: band lookup and hysteresis (no I/O, time passed in)."""
