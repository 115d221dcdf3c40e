"""The pages of `avtext.serve`: HTML with its CSS and JS inline (nothing loaded from the
internet, nothing built); the run page's curves are inline SVG drawn here."""
from __future__ import annotations

import html
import json

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#234;color:#fff;padding:8px 16px}header a{color:#cde;margin-right:16px}
header b{margin-right:24px}main{padding:12px 16px;max-width:1200px}
.msg{color:#a00;background:#fee;border:1px solid #e99;padding:6px 10px;margin:8px 0}
.msg:empty{display:none}.note{color:#666}
#layout{display:flex;gap:16px;align-items:flex-start}#results{flex:1;min-width:0}
#viewer{width:420px;position:sticky;top:8px}video,#frames{width:100%;background:#000}
.hit{border:1px solid #ccc;background:#fff;padding:6px 8px;margin:6px 0;cursor:pointer}
.hit:hover{border-color:#47a}.hit.bad{cursor:default;border-color:#e99}
.strip img{height:54px;margin-right:3px}.strip img.best{outline:3px solid #e80}
.timeline{position:relative;height:8px;background:#ddd;margin:4px 0}
.timeline span{position:absolute;top:0;height:8px;background:#e80}
select{max-width:32em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
pre{background:#fff;border:1px solid #ccc;padding:8px;max-height:400px;overflow:auto}
.curves{display:flex;flex-wrap:wrap;gap:8px}#points{flex-basis:100%}.curve{background:#fff;border:1px solid #ccc}
"""

COMMON_JS = r"""
function $(id){return document.getElementById(id)}
function say(text){$('message').textContent=text||''}
async function getJSON(url, options){
  const r=await fetch(url, options); let body;
  try{body=await r.json()}catch(e){body={error:r.status+' '+r.statusText}}
  if(!r.ok) throw new Error(body.error||('HTTP '+r.status));
  return body;
}
function q(params){return new URLSearchParams(params).toString()}
function mediaPath(collection, video){
  return encodeURIComponent(collection)+'/'+video.split('/').map(encodeURIComponent).join('/')}
"""

SEARCH_JS = r"""
let playing=null;
function fmt(s){return s.toFixed(2)}
function timeline(duration, start, end){
  const bar=document.createElement('div'); bar.className='timeline';
  const span=document.createElement('span');
  span.style.left=(100*start/duration)+'%';
  span.style.width=Math.max(0.5,100*(end-start)/duration)+'%';
  bar.title=fmt(start)+' - '+fmt(end)+' s of '+fmt(duration)+' s';
  bar.appendChild(span); return bar;
}
function play(hit){
  say('');
  if(hit.error){say(hit.error); return;}
  const player=$('player'), frames=$('frames');
  $('now').textContent=hit.video+'  '+fmt(hit.start)+' - '+fmt(hit.end)+' s';
  playing=hit; window.avtextSeeked=false;
  if(hit.kind==='frames'){
    player.style.display='none'; frames.style.display='block';
    let t=hit.start; const step=()=>{ if(playing!==hit) return;
      frames.src='/frame/'+mediaPath(hit.collection,hit.video)+'?'+q({t:t,height:240});
      window.avtextSeeked=true; t+=0.5; if(t<=hit.end) setTimeout(step,500)};
    step(); return;
  }
  frames.style.display='none'; player.style.display='block';
  player.onloadedmetadata=()=>{player.currentTime=hit.start};
  player.onseeked=()=>{window.avtextSeeked=true; if(playing===hit && player.paused) player.play().catch(()=>{})};
  player.ontimeupdate=()=>{if(playing===hit && player.currentTime>=hit.end) player.pause()};
  player.onerror=()=>say(hit.video+': the player cannot play this file');
  player.src='/media/'+mediaPath(hit.collection,hit.video);
}
function render(hits, moments){
  const list=$('hits'); list.textContent='';
  hits.forEach((hit,i)=>{
    const div=document.createElement('div'); div.className='hit'+(hit.error?' bad':'');
    div.dataset.video=hit.video;
    const head=document.createElement('div');
    head.textContent=(i+1)+'. '+hit.video+'   score '+hit.score.toFixed(4)+
      (hit.error?'':'   '+fmt(hit.start)+' - '+fmt(hit.end)+' s');
    div.appendChild(head);
    if(hit.error){const m=document.createElement('div'); m.className='msg';
      m.textContent=hit.error; div.appendChild(m);}
    else{
      if(!moments){const strip=document.createElement('div'); strip.className='strip';
        hit.clips.forEach((c,k)=>{const img=document.createElement('img');
          img.src='/frame/'+mediaPath(hit.collection,hit.video)+'?'+q({t:(c[0]+c[1])/2});
          img.title='clip '+(k+1)+': '+fmt(c[0])+' - '+fmt(c[1])+' s'+
            (hit.clip_scores?', score '+hit.clip_scores[k].toFixed(4):'');
          if(k===hit.best_clip) img.className='best'; strip.appendChild(img)});
        div.appendChild(strip);}
      div.appendChild(timeline(hit.duration, hit.start, hit.end));
    }
    div.onclick=()=>play(hit); list.appendChild(div);
  });
}
async function search(moments){
  say(''); $('hits').textContent=''; $('took').textContent='';
  const text=$('query').value;
  try{
    if(moments){
      const r=await getJSON('/api/moments?'+q({q:text,top:$('top').value}));
      render(r.moments, true);
      $('took').textContent=r.moments.length+' moments in '+r.seconds.toFixed(3)+' s';
    }else{
      const r=await getJSON('/api/search?'+q({q:text,index:$('index').value,top:$('top').value}));
      render(r.hits.map(h=>Object.assign(h,{collection:r.index})), false);
      $('took').textContent=r.hits.length+' videos in '+r.seconds.toFixed(3)+' s';
    }
  }catch(e){say(e.message)}
}
$('form').onsubmit=(e)=>{e.preventDefault(); search(false)};
if($('moments')) $('moments').onclick=(e)=>{e.preventDefault(); search(true)};
"""

CAPTION_JS = r"""
function show(r){$('caption').textContent=r.caption;
  $('took').textContent=r.video+': '+(r.beam===1?'greedy':'beam '+r.beam)+', '+r.seconds.toFixed(2)+' s'}
async function captionIndexed(e){
  e.preventDefault(); say(''); $('caption').textContent=''; $('took').textContent='';
  const [collection, video]=JSON.parse($('video').value);
  try{show(await getJSON('/api/caption',{method:'POST',headers:{'content-type':'application/json'},
    body:JSON.stringify({collection:collection,video:video,beam:parseInt($('beam').value)})}))}
  catch(err){say(err.message)}
}
async function captionUpload(e){
  e.preventDefault(); say(''); $('caption').textContent=''; $('took').textContent='';
  const file=$('file').files[0];
  if(!file){say('choose a video file to upload first'); return;}
  if(file.size>LIMIT){say(file.name+': larger than the limit of '+LIMIT_MB+
    ' MiB (--max_upload_mb)'); return;}
  try{show(await getJSON('/api/upload?'+q({name:file.name,beam:$('beam').value}),
    {method:'POST',headers:{'content-type':'application/octet-stream'},body:file}))}
  catch(err){say(err.message)}
}
if($('pick')) $('pick').onsubmit=captionIndexed;
$('upload').onsubmit=captionUpload;
"""


def _e(text) -> str:
  return html.escape(str(text), quote=True)


def _frame(served, title: str, body: str, script: str = "") -> str:
  nav = [("/", "Search")] + ([("/caption", "Caption")] if served.captioner else []) + (
      [("/run", "Run")] if served.runs else [])
  links = "".join(f'<a href="{href}">{name}</a>' for href, name in nav)
  js = f"<script>{COMMON_JS}{script}</script>" if script else ""
  return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>avtext: '
          f'{_e(title)}</title><style>{CSS}</style></head><body><header><b>avtext</b>'
          f'{links}</header><main><h2>{_e(title)}</h2><div id="message" class="msg" '
          f'role="alert"></div>{body}</main>{js}</body></html>')


def search_page(served) -> str:
  options = "".join(
      f'<option value="{_e(i.name)}">{_e(i.name)}'
      f'{" (built with another run)" if i.error else ""}</option>'
      for i in served.indexes.values())
  usable = [i for i in served.indexes.values() if not i.error]
  notes = "".join(f'<div class="msg">{_e(i.error)}</div>'
                  for i in served.indexes.values() if i.error)
  moments = ('<button id="moments" type="button">Search moments</button>'
             if served.moments else "")
  videos = '<button id="go" type="submit">Search videos</button>' if served.indexes else ""
  body = (f'{notes}<form id="form"><select id="index" name="index"'
          f'{"" if served.indexes else " hidden"}>{options}</select> '
          f'<input id="query" name="q" size="50" placeholder="a red ball bouncing" '
          f'autofocus> top <input id="top" type="number" value="5" min="1" max="50" '
          f'style="width:4em"> {videos} {moments}</form>'
          f'<div id="took" class="note"></div><div id="layout"><div id="results">'
          f'<div id="hits"></div></div><div id="viewer"><video id="player" controls '
          f'preload="metadata"></video><img id="frames" alt="" style="display:none">'
          f'<div id="now" class="note"></div></div></div>')
  if not usable and served.indexes:
    body += '<p class="note">No index can be searched with the served run.</p>'
  return _frame(served, "Search", body, SEARCH_JS)


def caption_page(served) -> str:
  picks = [(i.name, v) for i in served.indexes.values() if i.collection
           for v in sorted(i.collection.files)[:2000]]
  options = "".join(f'<option value="{_e(json.dumps([c, v]))}">{_e(c)}: {_e(v)}</option>'
                    for c, v in picks)
  beams = "".join(f'<option value="{b}">{"greedy" if b == 1 else f"beam {b}"}</option>'
                  for b in (1, 2, 4, 8))
  pick = (f'<form id="pick"><select id="video">{options}</select> '
          f'<button type="submit" id="go">Caption</button></form>' if picks else "")
  limit = served.max_upload_bytes
  body = (f'<p>decoding <select id="beam">{beams}</select></p>{pick}'
          f'<form id="upload"><p>or upload a video (at most {served.max_upload_mb:g} MiB): '
          f'<input type="file" id="file" accept="video/*"> '
          f'<button type="submit" id="send">Caption upload</button></p></form>'
          f'<h3>Caption</h3><p id="caption" style="font-size:18px"></p>'
          f'<p id="took" class="note"></p>')
  return _frame(served, "Caption", body, f"const LIMIT={limit}, LIMIT_MB="
                f"{json.dumps(f'{served.max_upload_mb:g}')};" + CAPTION_JS)


def curve_svg(tag: str, points, width: int = 300, height: int = 160) -> str:
  """One curve as inline SVG: the polyline of (step, value), its axes' ranges written."""
  steps = [s for s, _ in points]
  values = [v for _, v in points]
  x0, x1 = min(steps), max(steps)
  y0, y1 = min(values), max(values)
  pad, top = 8, 20
  sx = (lambda s: pad + (width - 2 * pad) * ((s - x0) / (x1 - x0) if x1 > x0 else 0.5))
  sy = (lambda v: height - pad - (height - top - 2 * pad) * (
      (v - y0) / (y1 - y0) if y1 > y0 else 0.5))
  line = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in points)
  dots = "".join(f'<circle cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="2" fill="#47a"/>'
                 for s, v in points[:200] if len(points) <= 200)
  return (f'<svg class="curve" data-tag="{_e(tag)}" width="{width}" height="{height}" '
          f'xmlns="http://www.w3.org/2000/svg"><text x="{pad}" y="14" font-size="12">'
          f'{_e(tag)}: {y0:.4g} .. {y1:.4g}, steps {x0} .. {x1}</text><polyline '
          f'points="{line}" fill="none" stroke="#47a" stroke-width="1.5"/>{dots}</svg>')


def _fmt(value) -> str:
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def metrics_table(results: dict) -> str:
  """results.json as a table: a row per metric, a column per entry (a step, "latest",
  "best", ...: each a {metric: value})."""
  columns = [k for k, v in results.items() if isinstance(v, dict)]
  metrics = sorted({m for c in columns for m in results[c]})
  head = "".join(f"<th>{_e(c)}</th>" for c in columns)
  rows = "".join(f"<tr><td>{_e(m)}</td>" + "".join(
      f"<td>{_e(_fmt(results[c][m])) if m in results[c] else ''}</td>" for c in columns)
      + "</tr>" for m in metrics)
  rest = "".join(f"<tr><td>{_e(k)}</td><td colspan={max(1, len(columns))}>{_e(_fmt(v))}"
                 f"</td></tr>" for k, v in results.items() if not isinstance(v, dict))
  return f'<table id="results"><tr><th>metric</th>{head}</tr>{rows}{rest}</table>'


def run_page(served, view: dict) -> str:
  runs = "".join(f'<option value="{_e(n)}"{" selected" if n == view["name"] else ""}>'
                 f'{_e(n)}: {_e(w)}</option>' for n, w in served.runs.items())
  curves = "".join(curve_svg(t, p) for t, p in view["curves"].items() if len(p) > 1)
  points = [f"{t} = {p[0][1]:.4g} (step {p[0][0]})" for t, p in view["curves"].items()
            if len(p) == 1]  # evaluated once: a number, not a curve
  if points:
    curves += f'<p class="note" id="points">one point each: {_e("; ".join(points))}</p>'
  body = (f'<form><select name="name" onchange="this.form.submit()">{runs}</select></form>'
          f'<p class="note">{_e(view["workdir"])}</p><h3>Training curves</h3>'
          f'<div class="curves" id="curves">{curves or "<p>no TensorBoard scalars</p>"}</div>'
          f'<h3>Metrics (results.json)</h3>'
          f'{metrics_table(view["results"]) if view["results"] else "<p>no results.json</p>"}'
          f'<h3>Config</h3><pre id="config">{_e(view["config"])}</pre>')
  return _frame(served, f"Run: {view['name']}", body)


def error_page(served, status: int, message: str) -> str:
  return _frame(served, f"Error {status}", f'<p class="msg" id="error">{_e(message)}</p>')
