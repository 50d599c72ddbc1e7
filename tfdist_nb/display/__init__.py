"""What the notebook shows: live attributed output, failure reports, the dashboard. Imported
lazily by the magics; nothing here talks to kernels, it only renders events and results."""
