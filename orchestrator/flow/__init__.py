"""Whole lifecycles that drive runs and judge them: campaign run/resume, compare --run, search, bisect."""
