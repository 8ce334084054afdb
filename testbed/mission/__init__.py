"""The fee-remediation mission: plan (pure), run (real processes), report (pure), HTML."""
