"""Front ends in processes of their own (`--frontend-workers N`): the HTTP and gRPC front ends parse,
decode and encode in N worker processes sharing the ports (SO_REUSEPORT), and hand every call to the
one core process, which owns the repository, the schedulers, the statistics and the shared memory
regions, over a Unix socket. Server-wide behaviour (batches across connections, statistics, model
control, `instance_group.count`) holds because that state exists once."""
