"""Data-parallel training over several processes: the replicas, the rendezvous and the launcher."""
