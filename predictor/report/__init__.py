"""Reports for people: self-contained HTML pages that compare's verdict and simulate's run share."""
