"""The admin API: the gRPC servicer over the daemon, its sockets and health."""
