package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// FuzzDecodeJSON: whatever a request body holds, DecodeJSON never panics;
// it refuses with a 400, or gives a value that encodes and decodes back to
// itself (nothing of the body was dropped on the way).
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"netns":"/var/run/netns/a","interface":"eth0","podNamespace":"default","podName":"a"}`,
		`{"netns":"/x","interface":"eth0","colour":"red"}`,
		`{"netns":"/x"} {"netns":"/y"}`,
		`[1,2]`, `null`, `{"interface":"\u0000"}`, ``, `{"netns":` + `"` + string(bytes.Repeat([]byte("a"), 100)) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest(http.MethodPut, "/v1/endpoints/x", bytes.NewReader(body))
		var in apiv1.EndpointCreate
		err := api.DecodeJSON(r, &in)
		if err != nil {
			if se, ok := errors.AsType[*api.StatusError](err); !ok || se.Status != http.StatusBadRequest {
				t.Fatalf("refused with %v, want a 400", err)
			}
			return
		}
		again, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var back apiv1.EndpointCreate
		if err := api.DecodeJSON(httptest.NewRequest(http.MethodPut, "/", bytes.NewReader(again)), &back); err != nil || !reflect.DeepEqual(back, in) {
			t.Fatalf("accepted %q as %+v, which does not decode back to itself: %+v, %v", body, in, back, err)
		}
	})
}
