package actors

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// coordinatorAdminCalls are librdkafka admin operations routed through
// rd_kafka_admin_coord_request. When the coordinator connection drops while
// one is in flight, librdkafka 2.11 can free the request's eonce and then
// touch it: the process aborts on "rd_kafka_enq_once_del_source_return:
// Assertion `eonce->refcnt > 0' failed" (librdkafka issue 4605). A broker
// cut is a fault ratchet must ride out, so no production code may call them.
var coordinatorAdminCalls = []string{
	"DescribeConsumerGroups",
	"ListConsumerGroupOffsets",
	"AlterConsumerGroupOffsets",
	"DeleteConsumerGroupOffsets",
	"DeleteConsumerGroups",
}

// TestNoCoordinatorAdminRequests fails when a non-test Go file of the module
// calls one of them. It caught the group-size check that aborted the fault
// suite's broker-cut test.
func TestNoCoordinatorAdminRequests(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		seen++
		for _, call := range coordinatorAdminCalls {
			if strings.Contains(string(b), "."+call+"(") {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s calls %s: a coordinator-targeted admin request can abort the process when the connection drops", rel, call)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 20 {
		t.Fatalf("walked %d Go files under %s: the module root was not found", seen, root)
	}
}
