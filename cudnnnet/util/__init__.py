"""Small helpers that know nothing of networks: printing names from files, did-you-mean
hints, lazy exports, a background thread."""
