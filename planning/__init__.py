"""Planning the big run: from a sweep's fit to a launchable run with every number's interval (`scalelab plan-run`)."""
