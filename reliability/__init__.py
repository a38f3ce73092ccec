"""The reliability suite: disconnect storm, soak, faults, abuse-shaped traffic (README "Reliability")."""
