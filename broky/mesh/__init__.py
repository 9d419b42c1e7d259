"""The router mesh: links between routers, worker processes, the cluster."""
