"""The read-only web dashboard that ``wardenctl dashboard`` serves on loopback.

It reads everything through the daemon's control socket (`source`), so it shows no
more than the user who started it could ask for, and never writes to the daemon.
`source` is the one module that knows the answers' field names; `poller` shares one
``status`` request per second between every open page; `plots` draws SVG; `pages`
renders the templates (escaped by default) and runbooks (markdown, raw HTML refused);
`server` holds the token, the headers and the routes.
"""
