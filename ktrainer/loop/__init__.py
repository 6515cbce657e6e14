"""The loop: fit's epochs and steps (fit_loop), validation, test and predict (evaluation), metrics to the
loggers (reporting), preemption, the History, the "Fit:" block and the stop line (run_summary), the
loop's state (trainer_state) and the run's one clock (run_clock)."""
