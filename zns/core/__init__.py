"""zns.core: everything that decides, with no sockets, threads, asyncio or clock."""
