"""The launcher process (`elasticrun`): CLI, hosts, launch, rendezvous and the HTTP API."""
