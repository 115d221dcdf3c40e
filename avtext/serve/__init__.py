"""A local web page over what avtext writes: `python -m avtext.serve` (__main__.py).

served.py holds what is served (the runs, loaded once; the indexes; the moment corpus)
and answers searches and captions through the programs' own library code
(`search_videos.IndexSearcher`, `search_moments.Searcher`, `caption.Captioner`); it also
decides which files may be read: only the videos an index lists (or the moment videos'
folder holds) and the runs' own files. app.py is the Starlette application (routes, HTTP
Range requests through Starlette's FileResponse, one-line errors as 4xx), page.py the
page itself (inline HTML, CSS and JS; curves as inline SVG): nothing is loaded from
the internet and nothing is built.
"""
