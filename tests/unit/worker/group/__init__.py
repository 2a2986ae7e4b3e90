"""elastic/worker/group: forming a round's process group, the Gloo interface, reachability."""
