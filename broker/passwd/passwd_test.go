package passwd

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

func TestHashAndVerify(t *testing.T) {
	h, err := HashCost("s3cret", 1000)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Verify([]byte("s3cret")) || c.Verify([]byte("s3cret ")) || c.Verify(nil) {
		t.Fatal("Verify accepts the wrong password or refuses the right one")
	}
	if h2, _ := HashCost("s3cret", 1000); h == h2 {
		t.Fatal("two hashes of one password are equal: no salt")
	}
	if _, err := Hash(""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty password: %v", err)
	}
	for _, bad := range []string{"", "plain", "pbkdf2-sha256$x$a$b", "pbkdf2-sha256$0$YQ$YQ", "md5$1$YQ$YQ", "pbkdf2-sha256$1$!!$YQ", "pbkdf2-sha256$1$YQ"} {
		if _, err := Parse(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if (Credential{}).Verify(nil) {
		t.Error("the zero Credential verifies")
	}
}

func TestBook(t *testing.T) {
	h, _ := HashCost("pw-one-two", 1000)
	c, _ := Parse(h)
	b := NewBook()
	b.Add("voice", c)
	for range 2 { // the second time from the remembered sum
		if !b.Check("voice", []byte("pw-one-two")) {
			t.Fatal("the right password is refused")
		}
	}
	for _, tc := range []struct{ user, pw string }{{"voice", "pw-one-tw"}, {"voice", ""}, {"other", "pw-one-two"}} {
		if b.Check(tc.user, []byte(tc.pw)) {
			t.Errorf("Check(%q, %q) accepted", tc.user, tc.pw)
		}
	}
	if !b.Has("voice") || b.Has("other") {
		t.Error("Has is wrong")
	}
	// Many at once, right and wrong, known and not: each gets its answer.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			user, pw, want := "voice", "pw-one-two", true
			switch i % 3 {
			case 1:
				pw, want = "wrong-pw-1", false
			case 2:
				user, want = fmt.Sprint("stranger-", i), false
			}
			if got := b.Check(user, []byte(pw)); got != want {
				t.Errorf("Check(%q, %q) = %v, want %v", user, pw, got, want)
			}
		})
	}
	wg.Wait()
	if NewBook().Check("anyone", []byte("anything")) {
		t.Error("an empty book admits someone")
	}
}

// FuzzParse: no hash string panics Parse, and a parsed hash never
// verifies an empty password.
func FuzzParse(f *testing.F) {
	h, _ := HashCost("pw", 1)
	for _, s := range []string{h, "", "pbkdf2-sha256$1$$", "pbkdf2-sha256$99999999999999999999$YQ$YQ", "a$b$c$d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil || c.iter > 10_000 {
			return // keep the fuzzer fast; huge counts are valid but slow
		}
		if c.Verify(nil) && len(c.key) >= 16 {
			t.Fatalf("%q verifies an empty password", s)
		}
	})
}
