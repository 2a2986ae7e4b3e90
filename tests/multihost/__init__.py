"""A multi-host test bed of network namespaces with real sshds (`tests.multihost.bed`)."""
