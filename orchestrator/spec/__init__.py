"""What a campaign is: the file's schema, strict loading, key paths, sweep expansion into points, software pins."""
