package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"time"
)

//go:embed static templates
var assets embed.FS

// asset is one embedded file under static/, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// staticAssets maps a name under /static/ to its file; version is a digest
// of all of them, appended to the page's asset URLs so a new binary is never
// served stale files from a browser cache.
var staticAssets, staticVersion = loadStatic()

var pageTemplate = template.Must(template.New("index.html").Funcs(template.FuncMap{
	"asset": func(name string) string { return "/static/" + name + "?v=" + staticVersion },
}).ParseFS(assets, "templates/index.html"))

var contentTypes = map[string]string{
	".css": "text/css; charset=utf-8",
	".js":  "text/javascript; charset=utf-8",
	".svg": "image/svg+xml",
}

func loadStatic() (map[string]asset, string) {
	out := make(map[string]asset)
	all := sha256.New()
	err := fs.WalkDir(assets, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		all.Write(sum[:])
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			ct = "application/octet-stream"
		}
		out[p[len("static/"):]] = asset{
			body:        b,
			contentType: ct,
			etag:        `"` + hex.EncodeToString(sum[:8]) + `"`,
		}
		return nil
	})
	if err != nil {
		panic("web: load embedded assets: " + err.Error())
	}
	return out, hex.EncodeToString(all.Sum(nil)[:6])
}

// staticHandler serves the embedded assets by exact name, with no directory
// listings. Names carry a version query, so browsers may keep them a day and
// revalidate with the ETag after that.
func staticHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := staticAssets[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", a.contentType)
		w.Header().Set("ETag", a.etag)
		w.Header().Set("Cache-Control", "public, max-age=86400")
		http.ServeContent(w, r, r.URL.Path, time.Time{}, bytes.NewReader(a.body))
	})
}
